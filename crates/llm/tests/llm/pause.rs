//! Pausing an engine: nothing is generated while paused, everything resumes where it was, and
//! cancelling while paused still frees the sequence.

use crate::common;

use std::time::Duration;

use common::runtime;
use modelmux_llm::{EngineConfig, GenerationEvent, GenerationRequest, SamplingParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_engine_generates_nothing_until_resumed() {
    let rt = runtime();
    let engine = rt.engine(EngineConfig::default());
    let prompt = rt.tokenizer.encode_prompt("The sky is", true).unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(12)
    };
    let expected = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap()
        .collect()
        .await
        .unwrap();

    let mut stream = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let Some(GenerationEvent::Token { .. }) = stream.next().await else {
        panic!("no first token")
    };
    engine.pause();
    assert!(engine.is_paused());
    // The engine looks at the flag before each step, so the step in flight when it was set
    // (if any) is the only one that can still run: from here the step and token counts may
    // grow by one, however long the engine is watched. (The stream may hold more: steps that
    // ran before the pause, while this task waited for a core, are counted at the pause.) An
    // engine that did not pause would run at least two of the 11 steps left within this
    // watch at any step time under 500 ms (3x the slowest measured on this busy machine,
    // 165 ms).
    let at_pause = engine.snapshot();
    let mut tokens = 1;
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(event) = tokio::time::timeout_at(quiet_until, stream.next()).await {
        match event {
            Some(GenerationEvent::Token { .. }) => tokens += 1,
            other => panic!("while paused: {other:?}"),
        }
    }
    let after_pause = engine.snapshot();
    assert!(
        after_pause.steps <= at_pause.steps + 1,
        "{} steps ran while paused",
        after_pause.steps - at_pause.steps
    );
    assert!(
        after_pause.generated_tokens <= at_pause.generated_tokens + 1,
        "{} tokens generated while paused",
        after_pause.generated_tokens - at_pause.generated_tokens
    );
    // Every token generated reached the stream (the first request's 12 before it).
    assert_eq!(
        tokens as u64,
        after_pause.generated_tokens - expected.tokens.len() as u64
    );
    assert!(tokens < 12, "the stream ended while paused");
    // One cancelled while paused is freed; a request submitted while paused waits (it is not
    // even admitted). The engine takes them in order, and drops cancelled ones before it
    // publishes its counts, so once it counts one waiting, the cancelled one is gone.
    drop(
        engine
            .submit(GenerationRequest {
                prompt: prompt.clone(),
                params: params.clone(),
                adapter: None,
                constraint: None,
            })
            .unwrap(),
    );
    let waiting = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.snapshot().waiting != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            engine.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = engine.snapshot();
    assert_eq!(
        (s.running, s.waiting, s.steps),
        (1, 1, after_pause.steps),
        "{s:?}"
    );

    engine.resume();
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { .. } => tokens += 1,
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(tokens, expected.tokens.len());
    assert_eq!(waiting.collect().await.unwrap().tokens, expected.tokens);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.snapshot().running + engine.snapshot().waiting > 0
        || engine.snapshot().kv_reserved_bytes > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            engine.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ray's `wakeup` with no traffic at all: the engine loads its weights again by itself and says
/// so within seconds (it once waited for a request to arrive, blocked on its queue), and the
/// next request is answered without another load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeup_with_no_traffic_reloads_at_once_and_only_once() {
    use std::sync::atomic::Ordering;

    let (engine, loads) = reloading_engine(None);
    let before = engine.submit(ask()).unwrap().collect().await.unwrap();
    for round in 0..2 {
        engine.sleep().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !engine.is_asleep() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: never asleep"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // At once in round 0 (the engine has just released its weights), after a quiet while
        // in round 1 (it waits on its queue, as it does with no traffic).
        tokio::time::sleep(Duration::from_millis(200 * round as u64)).await;
        engine.wake_up();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while engine.is_asleep() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: wake_up with no traffic did not load the weights within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(loads.load(Ordering::SeqCst), round + 1);
        let after = engine.submit(ask()).unwrap().collect().await.unwrap();
        assert_eq!(after.tokens, before.tokens, "same weights, same answer");
        assert_eq!(
            loads.load(Ordering::SeqCst),
            round + 1,
            "a request loaded again"
        );
    }
}

/// A wake-up whose load fails says so, and the next `wake_up` tries again and is waited for on
/// its own: it is not answered with the earlier failure. Waiting takes no polling: the engine
/// thread sends each change of the weights' state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wakeup_is_reported_and_the_next_one_loads() {
    use std::sync::atomic::Ordering;

    use modelmux_llm::WeightsState;

    // The first load fails (as a file deleted while asleep would), the others succeed.
    let (engine, loads) = reloading_engine(Some(0));
    let limit = Duration::from_secs(5);
    assert_eq!(engine.weights_state(), WeightsState::Loaded);
    engine.sleep().unwrap();
    let released = engine
        .wait_for_weights(|w| *w != WeightsState::Loaded, limit)
        .await;
    assert_eq!(released, Some(WeightsState::Released));

    engine.wake_up();
    let first = engine
        .wait_for_weights(|w| *w != WeightsState::Released, limit)
        .await;
    assert_eq!(
        first,
        Some(WeightsState::ReloadFailed(
            "internal error in the model: the disk went away".into()
        ))
    );
    assert!(engine.is_asleep());
    assert!(engine.wake_error().unwrap().contains("the disk went away"));

    engine.wake_up();
    assert_eq!(
        engine.weights_state(),
        WeightsState::Released,
        "a new attempt forgets the failed one"
    );
    let second = engine
        .wait_for_weights(|w| *w != WeightsState::Released, limit)
        .await;
    assert_eq!(second, Some(WeightsState::Loaded));
    assert_eq!(loads.load(Ordering::SeqCst), 2);
    let answer = engine.submit(ask()).unwrap().collect().await.unwrap();
    assert_eq!(answer.tokens.len(), 4);

    // A wait whose state never comes ends at its timeout.
    let never = engine
        .wait_for_weights(|w| *w == WeightsState::Released, Duration::from_millis(50))
        .await;
    assert_eq!(never, None);
}

/// An engine over the tiny model that can sleep, and the count of its reloads; the load
/// numbered `fail` (from 0), if any, fails.
fn reloading_engine(
    fail: Option<usize>,
) -> (
    modelmux_llm::Engine,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let tiny = common::tiny::tiny();
    let loads = Arc::new(AtomicUsize::new(0));
    let (path, counter) = (tiny.path.clone(), loads.clone());
    let reload: modelmux_llm::ModelReloader = Arc::new(move || {
        if Some(counter.fetch_add(1, Ordering::SeqCst)) == fail {
            return Err(modelmux_llm::LlmError::Internal(
                "the disk went away".into(),
            ));
        }
        let weights =
            modelmux_llm::LlamaWeights::load(&path, modelmux_llm::WeightFormat::default())?;
        Ok(Arc::new(modelmux_llm::LlamaModel::new(weights, 512)))
    });
    let engine = modelmux_llm::Engine::start_with_reload(
        tiny.model.clone(),
        Some(reload),
        tiny.tokenizer.clone(),
        EngineConfig {
            max_model_len: 512,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    (engine, loads)
}

/// Four tokens after a four-token prompt, greedy.
fn ask() -> GenerationRequest {
    GenerationRequest {
        prompt: vec![1, 2, 3, 4],
        params: SamplingParams::greedy(4),
        adapter: None,
        constraint: None,
    }
}

/// Asleep, an engine holds no reference to its weights: when no other replica shares them,
/// they are freed (the README's 188 MB to 75 MB). Awake again, it holds what it loaded, and
/// lets that go at the next sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_asleep_holds_no_weights() {
    use modelmux_llm::WeightsState;
    use std::sync::Arc;

    let (engine, loaded) = own_weights_engine(own_tiny_model());
    let limit = Duration::from_secs(5);
    let first = loaded.lock().take().unwrap();
    assert!(first.upgrade().is_some(), "the engine holds its weights");

    sleep_until_released(&engine, limit).await;
    // The state is sent after the engine let go: nothing is left to wait for.
    assert!(
        first.upgrade().is_none(),
        "asleep, the engine still keeps its weights alive ({} references)",
        first.strong_count()
    );

    engine.wake_up();
    let state = engine
        .wait_for_weights(|w| *w != WeightsState::Released, limit)
        .await;
    assert_eq!(state, Some(WeightsState::Loaded));
    let reloaded = loaded.lock().take().expect("a wake-up that loaded nothing");
    let model = reloaded
        .upgrade()
        .expect("awake, the engine holds its new weights");
    assert_eq!(Arc::strong_count(&model), 2, "the engine's and this test's");
    drop(model);
    let answer = engine.submit(ask()).unwrap().collect().await.unwrap();
    assert_eq!(answer.tokens.len(), 4);

    sleep_until_released(&engine, limit).await;
    assert!(
        reloaded.upgrade().is_none(),
        "the reloaded weights kept asleep"
    );
}

/// Two replicas sharing one copy of the weights: one asleep does not free them (the other
/// holds them and goes on serving); both asleep do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_weights_go_only_when_every_replica_sleeps() {
    let model = own_tiny_model();
    let weak = std::sync::Arc::downgrade(&model);
    let (a, _) = own_weights_engine(model.clone());
    let (b, _) = own_weights_engine(model);
    let limit = Duration::from_secs(5);
    assert_eq!(weak.strong_count(), 2, "one reference per replica");

    sleep_until_released(&a, limit).await;
    assert_eq!(
        weak.strong_count(),
        1,
        "the sleeping replica still holds the weights, or the other lost them"
    );
    let answer = b.submit(ask()).unwrap().collect().await.unwrap();
    assert_eq!(answer.tokens.len(), 4, "the awake replica serves");

    sleep_until_released(&b, limit).await;
    assert!(
        weak.upgrade().is_none(),
        "both replicas asleep, the weights are still alive ({} references)",
        weak.strong_count()
    );
}

/// A copy of the tiny model of the caller's own (the shared one is held by a static, so its
/// release could never be seen).
fn own_tiny_model() -> std::sync::Arc<modelmux_llm::LlamaModel> {
    let path = &common::tiny::tiny().path;
    let weights =
        modelmux_llm::LlamaWeights::load(path, modelmux_llm::WeightFormat::default()).unwrap();
    std::sync::Arc::new(modelmux_llm::LlamaModel::new(weights, 512))
}

/// Puts `engine` to sleep and waits until it has let its weights go.
async fn sleep_until_released(engine: &modelmux_llm::Engine, limit: Duration) {
    engine.sleep().unwrap();
    let state = engine
        .wait_for_weights(|w| *w != modelmux_llm::WeightsState::Loaded, limit)
        .await;
    assert_eq!(state, Some(modelmux_llm::WeightsState::Released));
}

/// A weak reference to the last model loaded (at the start or on a wake-up), which the test
/// takes.
type LastLoaded =
    std::sync::Arc<parking_lot::Mutex<Option<std::sync::Weak<modelmux_llm::LlamaModel>>>>;

/// An engine over `model` that can sleep, whose wake-ups load a copy of the tiny model of its
/// own; and the last model it was given, as a weak reference (the reloader keeps none).
fn own_weights_engine(
    model: std::sync::Arc<modelmux_llm::LlamaModel>,
) -> (modelmux_llm::Engine, LastLoaded) {
    use std::sync::Arc;

    let loaded: LastLoaded = Arc::new(parking_lot::Mutex::new(Some(Arc::downgrade(&model))));
    let last = loaded.clone();
    let reload: modelmux_llm::ModelReloader = Arc::new(move || {
        let model = own_tiny_model();
        *last.lock() = Some(Arc::downgrade(&model));
        Ok(model)
    });
    let engine = modelmux_llm::Engine::start_with_reload(
        model,
        Some(reload),
        common::tiny::tiny().tokenizer.clone(),
        EngineConfig {
            max_model_len: 512,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    (engine, loaded)
}
