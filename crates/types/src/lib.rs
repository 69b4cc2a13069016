//! `modelmux-types`: the words every layer of modelmux shares, without depending on any of
//! them: [`ModelId`] (validated once at the edge), the kinds of failure ([`ErrorKind`],
//! [`Failure`]: what a runtime says went wrong; only the serving layer turns a kind into an
//! HTTP status), and setting values checked while a configuration is parsed ([`Seconds`],
//! [`Attempts`], [`Checked`]).

mod id;
mod kind;
mod settings;

pub use id::{InvalidModelId, MAX_MODEL_ID_LEN, ModelId, is_unsafe_in_text};
pub use kind::{ErrorKind, Failure};
pub use settings::{Attempts, Checked, Seconds};
