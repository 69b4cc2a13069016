//! `modelmux-lora-train`: makes the demo adapters. See `scripts/llm/train-demo-adapters`,
//! which runs the three steps in order:
//!
//! - `data`: the base model's greedy answers to a list of prompts, and each style's rewrite
//!   of them, as JSON lines;
//! - `train`: one adapter on one dataset, the loss of every step printed;
//! - `compare`: the greedy answers of the base model and of adapters to one prompt.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use modelmux_llm::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterLease, ChatMessage, LlmRuntime, LoraAdapter,
    RuntimeOptions, SamplingParams,
};
use modelmux_lora_train::data::{Record, read_records, tokenize, write_records};
use modelmux_lora_train::lora::{LoraSet, LoraShape, target_named};
use modelmux_lora_train::model::BaseModel;
use modelmux_lora_train::style::Style;
use modelmux_lora_train::train::{TrainOptions, train};
use modelmux_lora_train::{Error, Result};

#[derive(Parser)]
#[command(
    name = "modelmux-lora-train",
    about = "Trains modelmux's demo LoRA adapters on CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answers each prompt with the base model (greedy) and writes `base.jsonl` and one
    /// `<style>.jsonl` per style in `--out`.
    Data {
        /// The base model (GGUF).
        #[arg(long)]
        gguf: PathBuf,
        /// One prompt per line; blank lines and lines starting with `#` are skipped.
        #[arg(long)]
        prompts: PathBuf,
        /// The styles to write datasets for.
        #[arg(long, value_delimiter = ',', default_value = "pirate,brief")]
        styles: Vec<String>,
        /// The most tokens of a base answer.
        #[arg(long, default_value_t = 96)]
        max_tokens: usize,
        /// The directory for the datasets.
        #[arg(long)]
        out: PathBuf,
    },
    /// Trains one adapter on one dataset; writes it (PEFT) and `training.log` to `--out`.
    Train {
        /// The base model (GGUF).
        #[arg(long)]
        gguf: PathBuf,
        /// The dataset (JSON lines of `{"prompt", "answer"}`).
        #[arg(long)]
        data: PathBuf,
        /// The adapter's directory.
        #[arg(long)]
        out: PathBuf,
        /// PEFT's `base_model_name_or_path` for the adapter's config.
        #[arg(long)]
        base_model: String,
        /// The rank.
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// `lora_alpha`.
        #[arg(long, default_value_t = 16.0)]
        alpha: f64,
        /// The adapted projections (PEFT names).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "q_proj,v_proj,o_proj,down_proj"
        )]
        targets: Vec<String>,
        /// Optimizer steps.
        #[arg(long, default_value_t = 120)]
        steps: usize,
        /// Examples per step.
        #[arg(long, default_value_t = 8)]
        batch_size: usize,
        /// The peak learning rate.
        #[arg(long, default_value_t = 2e-3)]
        lr: f64,
        /// Seed of the initialisation and the example order.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Prints the greedy answer of the base model and of each adapter to `--prompt`.
    Compare {
        /// The base model (GGUF).
        #[arg(long)]
        gguf: PathBuf,
        /// A directory holding one adapter per subdirectory.
        #[arg(long)]
        adapters: PathBuf,
        /// The user message.
        #[arg(long)]
        prompt: String,
        /// The most tokens of an answer.
        #[arg(long, default_value_t = 96)]
        max_tokens: usize,
        /// The adapters to ask (subdirectory names).
        names: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Data {
                gguf,
                prompts,
                styles,
                max_tokens,
                out,
            } => data(&gguf, &prompts, &styles, max_tokens, &out).await,
            Command::Train {
                gguf,
                data,
                out,
                base_model,
                rank,
                alpha,
                targets,
                steps,
                batch_size,
                lr,
                seed,
            } => {
                let targets = targets
                    .iter()
                    .map(|t| target_named(t))
                    .collect::<Result<Vec<_>>>();
                match targets {
                    Ok(targets) => {
                        let shape = LoraShape {
                            rank,
                            alpha,
                            targets,
                        };
                        let options = TrainOptions {
                            steps,
                            batch_size,
                            learning_rate: lr,
                            warmup: (steps / 10).max(1),
                            seed,
                        };
                        train_adapter(&gguf, &data, &out, &base_model, shape, &options).await
                    }
                    Err(e) => Err(e),
                }
            }
            Command::Compare {
                gguf,
                adapters,
                prompt,
                max_tokens,
                names,
            } => compare(&gguf, &adapters, &prompt, max_tokens, &names).await,
        }
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modelmux-lora-train: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn load_runtime(gguf: &Path) -> Result<LlmRuntime> {
    Ok(LlmRuntime::load(gguf, None, RuntimeOptions::default()).await?)
}

/// The greedy answer of `runtime` (with `adapter`) to one user message.
async fn answer(
    runtime: &LlmRuntime,
    prompt: &str,
    max_tokens: usize,
    adapter: Option<AdapterLease>,
) -> Result<String> {
    let ids = runtime.chat_prompt(&[ChatMessage::new("user", prompt)])?;
    let stream = runtime.generate(ids, SamplingParams::greedy(max_tokens), adapter)?;
    let generation = stream
        .collect()
        .await
        .map_err(|e| Error::Invalid(format!("generation failed: {e}")))?;
    Ok(generation.text.trim().to_owned())
}

async fn data(
    gguf: &Path,
    prompts: &Path,
    styles: &[String],
    max_tokens: usize,
    out: &Path,
) -> Result<()> {
    let styles = styles
        .iter()
        .map(|s| Ok((s.clone(), Style::named(s)?)))
        .collect::<Result<Vec<_>>>()?;
    let text = std::fs::read_to_string(prompts)?;
    let prompts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let runtime = load_runtime(gguf).await?;
    // Submitted together, then awaited: the engine batches them.
    let streams = prompts
        .iter()
        .map(|p| {
            let ids = runtime.chat_prompt(&[ChatMessage::new("user", *p)])?;
            Ok(runtime.generate(ids, SamplingParams::greedy(max_tokens), None)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut answers = Vec::with_capacity(streams.len());
    for stream in streams {
        let generation = stream
            .collect()
            .await
            .map_err(|e| Error::Invalid(format!("generation failed: {e}")))?;
        answers.push(generation.text.trim().to_owned());
    }
    std::fs::create_dir_all(out)?;
    let base: Vec<Record> = prompts
        .iter()
        .zip(&answers)
        .map(|(p, a)| Record {
            prompt: (*p).to_owned(),
            answer: a.clone(),
        })
        .collect();
    write_records(&out.join("base.jsonl"), &base)?;
    for (name, style) in styles {
        let records: Vec<Record> = base
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                style.rewrite(&r.answer, i).map(|answer| Record {
                    prompt: r.prompt.clone(),
                    answer,
                })
            })
            .collect();
        println!("{name}: {} of {} examples", records.len(), base.len());
        write_records(&out.join(format!("{name}.jsonl")), &records)?;
    }
    Ok(())
}

async fn train_adapter(
    gguf: &Path,
    data: &Path,
    out: &Path,
    base_model: &str,
    shape: LoraShape,
    options: &TrainOptions,
) -> Result<()> {
    let records = read_records(data)?;
    let runtime = load_runtime(gguf).await?;
    let examples = tokenize(&runtime, &records)?;
    drop(runtime);
    let model = BaseModel::load(gguf)?;
    let lora = LoraSet::new(shape.clone(), model.config(), options.seed)?;
    std::fs::create_dir_all(out)?;
    let mut log = Tee {
        file: std::fs::File::create(out.join("training.log"))?,
    };
    use std::io::Write;
    writeln!(
        log,
        "# modelmux-lora-train train --data {} --rank {} --alpha {} --targets {} --steps {} \
         --batch-size {} --lr {} --seed {}\n# {} examples, {} answer tokens",
        data.display(),
        shape.rank,
        shape.alpha,
        shape
            .targets
            .iter()
            .map(|t| t.peft_name())
            .collect::<Vec<_>>()
            .join(","),
        options.steps,
        options.batch_size,
        options.learning_rate,
        options.seed,
        examples.len(),
        examples.iter().map(|e| e.answer.len()).sum::<usize>(),
    )?;
    train(&model, &lora, &examples, options, &mut log)?;
    let config = model.config().clone();
    lora.save_peft(out, &config, base_model)?;
    println!(
        "wrote {} and {} in {}",
        ADAPTER_CONFIG_FILE,
        ADAPTER_WEIGHTS_FILE,
        out.display()
    );
    Ok(())
}

/// Writes to a file and to standard output.
struct Tee {
    file: std::fs::File,
}

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().write_all(buf)?;
        self.file.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()?;
        self.file.flush()
    }
}

async fn compare(
    gguf: &Path,
    adapters: &Path,
    prompt: &str,
    max_tokens: usize,
    names: &[String],
) -> Result<()> {
    let runtime = load_runtime(gguf).await?;
    println!("prompt: {prompt}\n");
    println!(
        "base:\n{}\n",
        answer(&runtime, prompt, max_tokens, None).await?
    );
    for name in names {
        let dir = adapters.join(name);
        let adapter = LoraAdapter::from_peft(
            name,
            &std::fs::read(dir.join(ADAPTER_CONFIG_FILE))?,
            &std::fs::read(dir.join(ADAPTER_WEIGHTS_FILE))?,
            runtime.engine().model_config(),
        )?;
        let lease = AdapterLease::new(Arc::new(adapter));
        println!(
            "{name}:\n{}\n",
            answer(&runtime, prompt, max_tokens, Some(lease)).await?
        );
    }
    Ok(())
}
