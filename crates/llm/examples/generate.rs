//! Generates a chat answer with a GGUF model, optionally with a LoRA adapter:
//!
//! ```sh
//! cargo run --release -p modelmux-llm --example generate -- MODEL.gguf "What is the capital of France?" [ADAPTER_DIR ADAPTER_ID]
//! ```

use modelmux_llm::{ChatMessage, GenerationEvent, LlmRuntime, RuntimeOptions, SamplingParams};
use modelmux_store::{ModelRepository, RepositoryOptions};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(question)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: generate MODEL.gguf QUESTION [ADAPTER_REPOSITORY ADAPTER_ID]");
        std::process::exit(2);
    };
    let repository = match args.get(3) {
        Some(dir) => Some(ModelRepository::open(dir, RepositoryOptions::default())?),
        None => None,
    };
    let started = Instant::now();
    // WEIGHTS=f32|q8_0|as-stored picks how the weights are held (see WeightFormat).
    let weight_format = match std::env::var("WEIGHTS").as_deref() {
        Ok("f32") => modelmux_llm::WeightFormat::F32,
        Ok("q8_0") => modelmux_llm::WeightFormat::Q8_0,
        Ok("as-stored") => modelmux_llm::WeightFormat::AsStored,
        _ => modelmux_llm::WeightFormat::Auto,
    };
    let options = RuntimeOptions {
        weight_format,
        ..RuntimeOptions::default()
    };
    let runtime = LlmRuntime::load(path, repository, options).await?;
    eprintln!("loaded in {:?}", started.elapsed());
    let adapter = match args.get(4) {
        Some(id) => Some(runtime.adapter(id).await?),
        None => None,
    };
    let prompt = runtime.chat_prompt(&[ChatMessage::new("user", question.as_str())])?;
    if std::env::var_os("SHOW_PROMPT").is_some() {
        eprintln!("{prompt:?}\n{:?}", runtime.tokenizer().decode(&prompt));
    }
    let started = Instant::now();
    let mut stream = runtime.generate(prompt, SamplingParams::greedy(128), adapter)?;
    let mut first = None;
    let mut n = 0;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { text, .. } => {
                first.get_or_insert_with(|| started.elapsed());
                n += 1;
                print!("{text}");
            }
            GenerationEvent::Finished { rest, reason, .. } => {
                println!("{rest}");
                let total = started.elapsed();
                let first = first.unwrap_or(total);
                eprintln!(
                    "[{}] {n} tokens, first after {first:?}, then {:.1} tokens/s",
                    reason.as_str(),
                    (n.max(2) - 1) as f64 / (total - first).as_secs_f64()
                );
            }
            GenerationEvent::Error(e) => return Err(e.to_string().into()),
        }
    }
    Ok(())
}
