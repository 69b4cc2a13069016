//! The JSON face of an ONNX model: its signature, requests checked against it, and responses.

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use serde_json::Value;
use tract_onnx::prelude::*;

/// One input of a model: its name, element type and shape (`None` for a symbolic dimension,
/// shown by its symbol).
#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    /// The input's name in the ONNX graph.
    pub name: String,
    /// Its element type.
    pub datum_type: DatumType,
    /// Its dimensions: `Ok(n)` fixed, `Err(symbol)` symbolic (any size, the same wherever
    /// the symbol appears).
    pub shape: Vec<Result<usize, String>>,
}

impl fmt::Display for InputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}': {} {}",
            self.name,
            type_name(self.datum_type),
            ShapeDisplay(&self.shape)
        )
    }
}

struct ShapeDisplay<'a>(&'a [Result<usize, String>]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('[')?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Ok(n) => write!(f, "{n}")?,
                Err(s) => f.write_str(s)?,
            }
        }
        f.write_char(']')
    }
}

/// A model's inputs and outputs, in the order the model takes and gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    /// The inputs.
    pub inputs: Vec<InputSpec>,
    /// The outputs' names.
    pub outputs: Vec<String>,
}

fn type_name(dt: DatumType) -> &'static str {
    match dt {
        DatumType::F32 => "float32",
        DatumType::F64 => "float64",
        DatumType::F16 => "float16",
        DatumType::I8 => "int8",
        DatumType::I16 => "int16",
        DatumType::I32 => "int32",
        DatumType::I64 => "int64",
        DatumType::U8 => "uint8",
        DatumType::U16 => "uint16",
        DatumType::U32 => "uint32",
        DatumType::U64 => "uint64",
        DatumType::Bool => "bool",
        _ => "an unsupported type",
    }
}

impl Signature {
    /// Reads the signature of an optimized model.
    pub fn of(model: &TypedModel) -> TractResult<Self> {
        let mut inputs = Vec::new();
        for outlet in model.input_outlets()? {
            let fact = model.outlet_fact(*outlet)?;
            let shape = fact
                .shape
                .iter()
                .map(|d| match d.to_i64() {
                    Ok(n) => usize::try_from(n).map_err(|_| d.to_string()),
                    Err(_) => Err(d.to_string()),
                })
                .collect();
            inputs.push(InputSpec {
                name: model.node(outlet.node).name.clone(),
                datum_type: fact.datum_type,
                shape,
            });
        }
        let outputs = model
            .output_outlets()?
            .iter()
            .map(|o| {
                model
                    .outlet_label(*o)
                    .unwrap_or(&model.node(o.node).name)
                    .to_string()
            })
            .collect();
        Ok(Self { inputs, outputs })
    }

    fn describe_inputs(&self) -> String {
        let specs: Vec<String> = self.inputs.iter().map(ToString::to_string).collect();
        specs.join(", ")
    }

    /// Checks a request body against the signature and builds the input tensors. The error is
    /// a message for the client (a 400).
    pub fn parse_request(&self, body: &[u8]) -> Result<TVec<TValue>, String> {
        let usage = || {
            format!(
                "send {{\"inputs\": {{name: nested arrays}}}} (or {{\"inputs\": array}} for a \
                 model with one input); this model takes {}",
                self.describe_inputs()
            )
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(format!("the request has no body: {}", usage()));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| format!("the request body is not valid JSON ({e}): {}", usage()))?;
        let inputs = match value {
            Value::Object(mut fields) => {
                let inputs = fields
                    .remove("inputs")
                    .ok_or_else(|| format!("the request has no \"inputs\" field: {}", usage()))?;
                if let Some(extra) = fields.keys().next() {
                    return Err(format!(
                        "unknown field \"{extra}\" in the request: {}",
                        usage()
                    ));
                }
                inputs
            }
            array @ Value::Array(_) => array,
            _ => {
                return Err(format!(
                    "the request body is not a JSON object: {}",
                    usage()
                ));
            }
        };
        let mut named: HashMap<String, Value> = match inputs {
            Value::Object(map) => map.into_iter().collect(),
            array @ Value::Array(_) if self.inputs.len() == 1 => {
                HashMap::from([(self.inputs[0].name.clone(), array)])
            }
            Value::Array(_) => {
                return Err(format!(
                    "this model has {} inputs, so they must be named: {}",
                    self.inputs.len(),
                    usage()
                ));
            }
            _ => {
                return Err(format!(
                    "\"inputs\" must be an object or an array: {}",
                    usage()
                ));
            }
        };
        let mut symbols = HashMap::new();
        let mut tensors = TVec::new();
        for spec in &self.inputs {
            let value = named
                .remove(&spec.name)
                .ok_or_else(|| format!("missing input {spec}"))?;
            tensors.push(to_tensor(spec, &value, &mut symbols)?.into_tvalue());
        }
        if let Some(unknown) = named.keys().next() {
            return Err(format!(
                "unknown input '{unknown}'; this model takes {}",
                self.describe_inputs()
            ));
        }
        Ok(tensors)
    }

    /// The response body: `{"model_id": ..., "outputs": {name: nested arrays}}`. Floats are
    /// written in their shortest exact form; NaN and infinities as `null`.
    pub fn render_response(&self, model_id: &str, outputs: &[TValue]) -> Result<String, String> {
        let mut out =
            String::with_capacity(64 + outputs.iter().map(|t| t.len() * 12).sum::<usize>());
        out.push_str("{\"model_id\":");
        out.push_str(&Value::from(model_id).to_string());
        out.push_str(",\"outputs\":{");
        for (i, (name, tensor)) in self.outputs.iter().zip(outputs).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&Value::from(name.as_str()).to_string());
            out.push(':');
            write_tensor(&mut out, tensor).map_err(|e| format!("output '{name}': {e}"))?;
        }
        out.push_str("}}");
        Ok(out)
    }
}

/// The shape of a nested JSON array and its leaves in row-major order; ragged arrays refused.
/// The shape a nested JSON array claims, read from the first element at each depth (checked
/// against the whole array by [`flatten`]).
fn claimed_shape(value: &Value) -> Vec<usize> {
    let mut shape = Vec::new();
    let mut probe = value;
    while let Value::Array(items) = probe {
        shape.push(items.len());
        match items.first() {
            Some(first) => probe = first,
            None => break,
        }
    }
    shape
}

/// The leaves of a nested JSON array of `shape`, in row-major order; ragged arrays refused.
fn flatten<'a>(name: &str, value: &'a Value, shape: &[usize]) -> Result<Vec<&'a Value>, String> {
    // No capacity from the shape: it comes from the first element at each depth, so a ragged
    // request could claim a size it does not have. Leaves are collected as they are found.
    let mut leaves = Vec::new();
    fn walk<'a>(
        name: &str,
        value: &'a Value,
        shape: &[usize],
        depth: usize,
        leaves: &mut Vec<&'a Value>,
    ) -> Result<(), String> {
        match (value, shape.get(depth)) {
            (Value::Array(items), Some(&len)) if items.len() == len => items
                .iter()
                .try_for_each(|v| walk(name, v, shape, depth + 1, leaves)),
            (Value::Array(items), Some(&len)) => Err(format!(
                "input '{name}' is not a rectangular array: an array at depth {depth} has {} \
                 values where the first has {len}",
                items.len()
            )),
            (Value::Array(_), None) | (_, Some(_)) => Err(format!(
                "input '{name}' is not a rectangular array: values are nested to different depths"
            )),
            (leaf, None) => {
                leaves.push(leaf);
                Ok(())
            }
        }
    }
    walk(name, value, shape, 0, &mut leaves)?;
    Ok(leaves)
}

fn to_tensor(
    spec: &InputSpec,
    value: &Value,
    symbols: &mut HashMap<String, usize>,
) -> Result<Tensor, String> {
    let shape = claimed_shape(value);
    let mismatch = || {
        format!(
            "input '{}' expects shape {} ({}), got {:?}",
            spec.name,
            ShapeDisplay(&spec.shape),
            type_name(spec.datum_type),
            shape
        )
    };
    if shape.len() != spec.shape.len() {
        return Err(mismatch());
    }
    for (&got, want) in shape.iter().zip(&spec.shape) {
        match want {
            Ok(n) if *n != got => return Err(mismatch()),
            Ok(_) => {}
            Err(symbol) => {
                if got == 0 {
                    return Err(format!("{}: dimension {symbol} cannot be 0", mismatch()));
                }
                let bound = *symbols.entry(symbol.clone()).or_insert(got);
                if bound != got {
                    return Err(format!(
                        "{}: dimension {symbol} is {bound} in another input",
                        mismatch()
                    ));
                }
            }
        }
    }
    // Only now, with the shape known to be the model's, are the values walked.
    let leaves = flatten(&spec.name, value, &shape)?;
    let bad = |index: usize, v: &Value| {
        let mut at = Vec::with_capacity(shape.len());
        let mut rest = index;
        for &d in shape.iter().rev() {
            at.push(rest % d.max(1));
            rest /= d.max(1);
        }
        at.reverse();
        format!(
            "input '{}' expects {} values; {v} at {at:?} is not one",
            spec.name,
            type_name(spec.datum_type)
        )
    };
    macro_rules! collect {
        ($t:ty, $convert:expr) => {{
            let data: Result<Vec<$t>, String> = leaves
                .iter()
                .enumerate()
                .map(|(i, v)| $convert(*v).ok_or_else(|| bad(i, v)))
                .collect();
            Tensor::from_shape::<$t>(&shape, &data?).map_err(|e| e.to_string())
        }};
    }
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Option<T> {
        match v {
            Value::Number(n) => n
                .as_i64()
                .and_then(|i| T::try_from(i).ok())
                .or_else(|| n.as_u64().and_then(|u| T::try_from(u).ok())),
            _ => None,
        }
    }
    match spec.datum_type {
        DatumType::F32 => collect!(f32, |v: &Value| {
            // Out of float32's range would silently become infinity: refuse it instead.
            v.as_f64().map(|x| x as f32).filter(|x| x.is_finite())
        }),
        DatumType::F64 => collect!(f64, Value::as_f64),
        DatumType::I8 => collect!(i8, int::<i8>),
        DatumType::I16 => collect!(i16, int::<i16>),
        DatumType::I32 => collect!(i32, int::<i32>),
        DatumType::I64 => collect!(i64, int::<i64>),
        DatumType::U8 => collect!(u8, int::<u8>),
        DatumType::U16 => collect!(u16, int::<u16>),
        DatumType::U32 => collect!(u32, int::<u32>),
        DatumType::U64 => collect!(u64, int::<u64>),
        DatumType::Bool => collect!(bool, Value::as_bool),
        other => Err(format!(
            "input '{}' has element type {other:?}, which JSON requests cannot carry",
            spec.name
        )),
    }
}

fn write_tensor(out: &mut String, tensor: &Tensor) -> Result<(), String> {
    fn nest<T>(out: &mut String, shape: &[usize], data: &[T], leaf: &impl Fn(&mut String, &T)) {
        match shape.split_first() {
            None => leaf(out, &data[0]),
            Some((&n, rest)) => {
                let stride: usize = rest.iter().product();
                out.push('[');
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    nest(out, rest, &data[i * stride..(i + 1) * stride], leaf);
                }
                out.push(']');
            }
        }
    }
    // Debug is the shortest form that reads back exactly, with an exponent for tiny and huge
    // values (`3.350383e-9`), which JSON accepts.
    fn float<T: Into<f64> + Copy + fmt::Debug>(out: &mut String, x: &T) {
        if (*x).into().is_finite() {
            let _ = write!(out, "{x:?}");
        } else {
            out.push_str("null");
        }
    }
    fn display<T: fmt::Display>(out: &mut String, x: &T) {
        let _ = write!(out, "{x}");
    }
    let shape = tensor.shape();
    macro_rules! emit {
        ($t:ty, $leaf:expr) => {{
            let view = tensor.try_as_plain_ram().map_err(|e| e.to_string())?;
            let data = view.as_slice::<$t>().map_err(|e| e.to_string())?;
            nest(out, shape, data, &$leaf);
            Ok(())
        }};
    }
    match tensor.datum_type() {
        DatumType::F32 => emit!(f32, float::<f32>),
        DatumType::F64 => emit!(f64, float::<f64>),
        DatumType::I8 => emit!(i8, display::<i8>),
        DatumType::I16 => emit!(i16, display::<i16>),
        DatumType::I32 => emit!(i32, display::<i32>),
        DatumType::I64 => emit!(i64, display::<i64>),
        DatumType::U8 => emit!(u8, display::<u8>),
        DatumType::U16 => emit!(u16, display::<u16>),
        DatumType::U32 => emit!(u32, display::<u32>),
        DatumType::U64 => emit!(u64, display::<u64>),
        DatumType::Bool => emit!(bool, display::<bool>),
        other => Err(format!("element type {other:?} cannot be written as JSON")),
    }
}
