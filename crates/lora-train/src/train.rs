//! The training loop: cross-entropy on the answers' tokens, AdamW on the adapters only, a
//! linear warm-up then cosine decay of the learning rate, and a line per step for the loss
//! curve.

use std::io::Write;

use candle_core::{D, Tensor, Var};
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::data::{Batch, Example, batch};
use crate::lora::LoraSet;
use crate::model::BaseModel;
use crate::{Error, Result};

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Optimizer steps.
    pub steps: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Steps of linear warm-up.
    pub warmup: usize,
    /// Seed of the example order.
    pub seed: u64,
}

/// The mean cross-entropy (natural log) of the scored tokens of `batch`.
pub fn loss(model: &BaseModel, lora: &LoraSet, batch: &Batch) -> Result<Tensor> {
    let hidden = model.hidden(&batch.ids, lora)?;
    let d = model.config().d_model;
    let scored = hidden.reshape(((), d))?.index_select(&batch.positions, 0)?;
    let logits = model.logits(&scored)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let log_sum = (logits
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &max)?;
    let chosen = logits.gather(&batch.targets, 1)?;
    Ok((log_sum - chosen)?.mean_all()?)
}

/// AdamW (decoupled weight decay 0: adapters start at zero delta and need no pull back).
struct AdamW<'a> {
    vars: Vec<&'a Var>,
    first: Vec<Tensor>,
    second: Vec<Tensor>,
    step: i32,
}

impl<'a> AdamW<'a> {
    const BETA1: f64 = 0.9;
    const BETA2: f64 = 0.999;
    const EPS: f64 = 1e-8;

    fn new(vars: Vec<&'a Var>) -> Result<Self> {
        let zeros = |v: &&Var| v.as_tensor().zeros_like();
        Ok(Self {
            first: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
            second: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
            vars,
            step: 0,
        })
    }

    fn step(&mut self, loss: &Tensor, lr: f64) -> Result<()> {
        let grads = loss.backward()?;
        self.step += 1;
        let correct1 = 1.0 - Self::BETA1.powi(self.step);
        let correct2 = 1.0 - Self::BETA2.powi(self.step);
        for (i, var) in self.vars.iter().enumerate() {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue;
            };
            self.first[i] = ((&self.first[i] * Self::BETA1)? + (grad * (1.0 - Self::BETA1))?)?;
            self.second[i] =
                ((&self.second[i] * Self::BETA2)? + (grad.sqr()? * (1.0 - Self::BETA2))?)?;
            let m = (&self.first[i] / correct1)?;
            let v = (&self.second[i] / correct2)?;
            let update = (m / (v.sqrt()? + Self::EPS)?)?;
            var.set(&(var.as_tensor() - (update * lr)?)?)?;
        }
        Ok(())
    }
}

/// The learning rate at `step` (0-based): linear warm-up, then cosine decay to a tenth.
fn learning_rate(options: &TrainOptions, step: usize) -> f64 {
    let peak = options.learning_rate;
    if step < options.warmup {
        return peak * (step + 1) as f64 / options.warmup as f64;
    }
    let span = (options.steps - options.warmup).max(1) as f64;
    let progress = (step - options.warmup) as f64 / span;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// Trains `lora` on `examples`, writing `step loss lr seconds` per step to `log`. Returns
/// each step's loss.
pub fn train(
    model: &BaseModel,
    lora: &LoraSet,
    examples: &[Example],
    options: &TrainOptions,
    log: &mut dyn Write,
) -> Result<Vec<f32>> {
    if examples.is_empty() || options.batch_size == 0 || options.steps == 0 {
        return Err(Error::Invalid(
            "training needs examples, a batch size and steps".into(),
        ));
    }
    let mut optimizer = AdamW::new(lora.vars())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(options.seed);
    let mut order: Vec<usize> = Vec::new();
    let mut losses = Vec::with_capacity(options.steps);
    let started = std::time::SystemTime::now();
    for step in 0..options.steps {
        let mut chosen = Vec::with_capacity(options.batch_size);
        while chosen.len() < options.batch_size.min(examples.len()) {
            if order.is_empty() {
                order = (0..examples.len()).collect();
                order.shuffle(&mut rng);
            }
            chosen.extend(order.pop().map(|i| &examples[i]));
        }
        let batch = batch(&chosen)?;
        let loss = loss(model, lora, &batch)?;
        let value = loss.to_scalar::<f32>()?;
        let lr = learning_rate(options, step);
        optimizer.step(&loss, lr)?;
        losses.push(value);
        let seconds = started.elapsed().map(|d| d.as_secs_f64()).unwrap_or(0.0);
        writeln!(
            log,
            "step {:>4}  loss {value:.4}  lr {lr:.2e}  {seconds:.0} s",
            step + 1
        )?;
        log.flush()?;
    }
    Ok(losses)
}
