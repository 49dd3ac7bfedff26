//! KServe v2 tensors: the JSON request and response bodies, and the binary-data extension
//! (a JSON header followed by raw tensor bytes, its length in `Inference-Header-Content-Length`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, Result};

/// The header that says how long the JSON part of a binary-data body is.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// An inference request as sent (`POST /v2/models/{name}/infer`).
#[derive(Debug, Deserialize)]
pub struct InferRequest {
    /// Echoed back in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// Request parameters (`binary_data_output` is understood).
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// The input tensors.
    pub inputs: Vec<RawInput>,
    /// The outputs wanted; all of the model's when absent.
    #[serde(default)]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// One input tensor as sent: data inline as JSON, or `binary_data_size` bytes after the header.
#[derive(Debug, Deserialize)]
pub struct RawInput {
    /// Input name.
    pub name: String,
    /// Shape; every dimension must be non-negative.
    pub shape: Vec<i64>,
    /// KServe datatype name (`FP32`, `INT64`, `BYTES`, ...).
    pub datatype: String,
    /// Tensor parameters (`binary_data_size` is understood).
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// Row-major data, flat or nested.
    #[serde(default)]
    pub data: Option<Value>,
}

/// One wanted output.
#[derive(Debug, Deserialize)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// Output parameters (`binary_data` is understood).
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// Decoded tensor values.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// `FP32`.
    F32(Vec<f32>),
    /// `INT64` (and `INT32`, widened).
    I64(Vec<i64>),
    /// `BYTES`: one byte string per element.
    Bytes(Vec<Vec<u8>>),
}

impl Data {
    /// The KServe datatype name.
    pub fn datatype(&self) -> &'static str {
        match self {
            Data::F32(_) => "FP32",
            Data::I64(_) => "INT64",
            Data::Bytes(_) => "BYTES",
        }
    }
}

/// One decoded input tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Input name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values, `shape.iter().product()` of them.
    pub data: Data,
}

/// Splits a request body into its JSON part and the binary tail, as the header says.
pub fn split_body<'a>(body: &'a [u8], header_len: Option<&str>) -> Result<(&'a [u8], &'a [u8])> {
    let Some(len) = header_len else {
        return Ok((body, &[]));
    };
    let n: usize = len
        .trim()
        .parse()
        .map_err(|_| Error::BadRequest(format!("bad {HEADER_LENGTH}: {len:?}")))?;
    if n > body.len() {
        return Err(Error::BadRequest(format!(
            "{HEADER_LENGTH} is {n} but the body has {} bytes",
            body.len()
        )));
    }
    Ok(body.split_at(n))
}

/// Most dimensions a tensor shape may have.
pub const MAX_RANK: usize = 8;

/// Decodes every input of `req`, taking binary data from `binary` in input order.
///
/// Nothing is allocated from a size the client declared before it is checked: each shape's
/// element count is computed with checked arithmetic, held to `max_elements` (summed over the
/// request's inputs; over it is [`Error::TooLarge`], 413), and compared with the data
/// actually present (the JSON values, or the bytes of the binary part) before any buffer is
/// made. FP32 values must be finite and within f32's range; INT32 values within i32's.
///
/// ```
/// use streampool_serve::kserve::tensors::{decode_inputs, Data, InferRequest};
/// let req: InferRequest = serde_json::from_str(
///     r#"{"inputs":[{"name":"x","shape":[4294967296,256],"datatype":"FP32","data":[0.0]}]}"#,
/// ).unwrap();
/// assert!(decode_inputs(&req, &[], 1 << 20).is_err()); // refused, nothing allocated
/// let req: InferRequest = serde_json::from_str(
///     r#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1.5, 2]}]}"#,
/// ).unwrap();
/// assert_eq!(decode_inputs(&req, &[], 16).unwrap()[0].data, Data::F32(vec![1.5, 2.0]));
/// ```
pub fn decode_inputs(
    req: &InferRequest,
    mut binary: &[u8],
    max_elements: usize,
) -> Result<Vec<Input>> {
    let mut out = Vec::with_capacity(req.inputs.len());
    let mut elements = 0usize;
    for raw in &req.inputs {
        if raw.shape.len() > MAX_RANK {
            return Err(bad(
                &raw.name,
                format!(
                    "shape has {} dimensions; at most {MAX_RANK} are accepted",
                    raw.shape.len()
                ),
            ));
        }
        let shape = raw
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                bad(
                    &raw.name,
                    format!("negative dimension in shape {:?}", raw.shape),
                )
            })?;
        let count = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(&raw.name, format!("shape {shape:?} overflows")))?;
        elements = elements.saturating_add(count);
        if elements > max_elements {
            return Err(Error::TooLarge(format!(
                "input {:?}: shape {shape:?} brings the request to {elements} elements, over the \
                 limit of {max_elements} per request",
                raw.name
            )));
        }
        let data = match raw.parameters.get("binary_data_size") {
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| bad(&raw.name, "binary_data_size must be an integer".into()))?;
                if size > binary.len() {
                    return Err(bad(
                        &raw.name,
                        format!(
                            "binary_data_size {size} exceeds the {} bytes left",
                            binary.len()
                        ),
                    ));
                }
                let (mine, rest) = binary.split_at(size);
                binary = rest;
                decode_binary(&raw.name, &raw.datatype, mine, count)?
            }
            None => {
                let value = raw
                    .data
                    .as_ref()
                    .ok_or_else(|| bad(&raw.name, "no data and no binary_data_size".into()))?;
                decode_json(&raw.name, &raw.datatype, value, count)?
            }
        };
        out.push(Input {
            name: raw.name.clone(),
            shape,
            data,
        });
    }
    if !binary.is_empty() {
        return Err(Error::BadRequest(format!(
            "{} bytes of binary data not claimed by any input",
            binary.len()
        )));
    }
    Ok(out)
}

fn bad(input: &str, msg: String) -> Error {
    Error::BadRequest(format!("input {}: {msg}", streampool_nn::Quoted(input)))
}

fn decode_json(name: &str, datatype: &str, value: &Value, count: usize) -> Result<Data> {
    // Sized by the values present (bounded by the body), never by the declared count.
    let mut leaves = Vec::new();
    flatten(value, &mut leaves, 0).map_err(|m| bad(name, m))?;
    if leaves.len() != count {
        return Err(bad(
            name,
            format!("{} values do not match the shape's {count}", leaves.len()),
        ));
    }
    let wrong = |v: &Value| bad(name, format!("value {v} is not a valid {datatype}"));
    Ok(match datatype {
        "FP32" => Data::F32(
            leaves
                .iter()
                .map(|v| {
                    v.as_f64().and_then(finite_f32).ok_or_else(|| {
                        bad(
                            name,
                            format!("value {v} is not a finite FP32 (|x| <= {:e})", f32::MAX),
                        )
                    })
                })
                .collect::<Result<_>>()?,
        ),
        "INT64" | "INT32" => Data::I64(
            leaves
                .iter()
                .map(|v| {
                    v.as_i64()
                        .filter(|&x| datatype == "INT64" || i32::try_from(x).is_ok())
                        .ok_or_else(|| wrong(v))
                })
                .collect::<Result<_>>()?,
        ),
        "BYTES" => Data::Bytes(
            leaves
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(|s| s.as_bytes().to_vec())
                        .ok_or_else(|| wrong(v))
                })
                .collect::<Result<_>>()?,
        ),
        other => return Err(bad(name, format!("unsupported datatype {other:?}"))),
    })
}

/// Row-major leaves of nested arrays. Depth is bounded so a hostile body cannot recurse deep.
fn flatten<'a>(
    v: &'a Value,
    out: &mut Vec<&'a Value>,
    depth: usize,
) -> std::result::Result<(), String> {
    match v {
        Value::Array(items) if depth < 8 => {
            for item in items {
                flatten(item, out, depth + 1)?;
            }
            Ok(())
        }
        Value::Array(_) => Err("data nested deeper than 8 levels".into()),
        leaf => {
            out.push(leaf);
            Ok(())
        }
    }
}

/// `x` as an f32 when it is finite and within f32's range (rounding to the nearest f32 is
/// fine; overflowing to infinity is not).
fn finite_f32(x: f64) -> Option<f32> {
    let y = x as f32;
    y.is_finite().then_some(y)
}

fn decode_binary(name: &str, datatype: &str, bytes: &[u8], count: usize) -> Result<Data> {
    let fixed = |width: usize| -> Result<()> {
        if Some(bytes.len()) != count.checked_mul(width) {
            return Err(bad(
                name,
                format!(
                    "{} bytes do not hold {count} {datatype} values",
                    bytes.len()
                ),
            ));
        }
        Ok(())
    };
    Ok(match datatype {
        "FP32" => {
            fixed(4)?;
            let values: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if let Some(at) = values.iter().position(|x| !x.is_finite()) {
                return Err(bad(
                    name,
                    format!("value {} at element {at} is not a finite FP32", values[at]),
                ));
            }
            Data::F32(values)
        }
        "INT64" => {
            fixed(8)?;
            Data::I64(
                bytes
                    .chunks_exact(8)
                    // `chunks_exact(8)` yields 8-byte chunks only, so the fallback never runs.
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            )
        }
        "INT32" => {
            fixed(4)?;
            Data::I64(
                bytes
                    .chunks_exact(4)
                    .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect(),
            )
        }
        "BYTES" => {
            // Each element: a 4-byte little-endian length, then that many bytes. So the bytes
            // hold at most a quarter as many elements: a larger declared count is refused
            // before anything is allocated for it.
            if count > bytes.len() / 4 {
                return Err(bad(
                    name,
                    format!(
                        "{} bytes cannot hold the shape's {count} BYTES elements",
                        bytes.len()
                    ),
                ));
            }
            let mut items = Vec::with_capacity(count);
            let mut rest = bytes;
            while !rest.is_empty() {
                let (len, tail) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| bad(name, "truncated BYTES element length".into()))?;
                let len = u32::from_le_bytes(*len) as usize;
                if len > tail.len() {
                    return Err(bad(name, "truncated BYTES element".into()));
                }
                let (item, tail) = tail.split_at(len);
                items.push(item.to_vec());
                rest = tail;
            }
            if items.len() != count {
                return Err(bad(
                    name,
                    format!(
                        "{} BYTES elements do not match the shape's {count}",
                        items.len()
                    ),
                ));
            }
            Data::Bytes(items)
        }
        other => return Err(bad(name, format!("unsupported datatype {other:?}"))),
    })
}

/// One output tensor of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// Output name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub values: Vec<f32>,
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a [f32]>,
}

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<OutputJson<'a>>,
}

/// Encodes a response: all JSON, or, when some output is wanted as binary, a JSON header
/// followed by those outputs' little-endian bytes. Returns the body and, for a binary body,
/// the header length to send in [`HEADER_LENGTH`].
pub fn encode_response(
    model: &str,
    id: Option<&str>,
    outputs: &[(Output, bool)],
) -> Result<(Vec<u8>, Option<usize>)> {
    let json = ResponseJson {
        model_name: model,
        model_version: "1",
        id,
        outputs: outputs
            .iter()
            .map(|(o, binary)| OutputJson {
                name: &o.name,
                datatype: "FP32",
                shape: &o.shape,
                parameters: binary
                    .then(|| serde_json::json!({ "binary_data_size": 4 * o.values.len() })),
                data: (!binary).then_some(o.values.as_slice()),
            })
            .collect(),
    };
    let mut body =
        serde_json::to_vec(&json).map_err(|e| Error::Internal(format!("encoding: {e}")))?;
    if !outputs.iter().any(|(_, binary)| *binary) {
        return Ok((body, None));
    }
    let header_len = body.len();
    for (o, _) in outputs.iter().filter(|(_, binary)| *binary) {
        body.extend(o.values.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok((body, Some(header_len)))
}
