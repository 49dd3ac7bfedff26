//! Checks each successful answer before counting it: the right number of embeddings, in
//! order, all of one width (the width the run expects), every value a finite number. An
//! answer that fails is counted as malformed (an error), never as served.
//!
//! Vectors are walked, not collected: each float is parsed and checked, and nothing is
//! allocated per value, so checking costs the load generator about what reading the bytes
//! does.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::corpus::{Encoding, Route};

/// The width of one embedding as the answer holds it, and whether it was a base64 string
/// (else a float list).
struct Vector(usize, bool);

impl<'de> Deserialize<'de> for Vector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vector;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of finite numbers or a base64 string")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vector, A::Error> {
                let mut n = 0;
                while let Some(x) = seq.next_element::<f32>()? {
                    if !x.is_finite() {
                        return Err(de::Error::custom("a value is not finite"));
                    }
                    n += 1;
                }
                Ok(Vector(n, false))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Vector, E> {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|e| E::custom(format!("bad base64: {e}")))?;
                if bytes.len() % 4 != 0 {
                    return Err(E::custom("base64 length is not a whole number of f32"));
                }
                if bytes
                    .chunks_exact(4)
                    .any(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
                {
                    return Err(E::custom("a value is not finite"));
                }
                Ok(Vector(bytes.len() / 4, true))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct OpenAiItem {
    index: usize,
    embedding: Vector,
}

#[derive(Deserialize)]
struct OpenAiAnswer {
    data: Vec<OpenAiItem>,
}

/// What a well-formed answer must be, shared by every connection of a run.
pub struct Expect {
    pub route: Route,
    pub encoding: Encoding,
    pub inputs: usize,
    /// The width: given, or learned from the first well-formed answer (0 until then); every
    /// later answer must match it.
    dim: AtomicUsize,
}

impl Expect {
    /// Expect `inputs` embeddings per answer of `route`, of width `dim` when known.
    pub fn new(route: Route, encoding: Encoding, inputs: usize, dim: Option<usize>) -> Self {
        Self {
            route,
            encoding,
            inputs,
            dim: AtomicUsize::new(dim.unwrap_or(0)),
        }
    }

    /// The width expected (0: none seen yet).
    pub fn dim(&self) -> usize {
        self.dim.load(Ordering::Relaxed)
    }

    /// Checks a 2xx answer's body; the error says what is wrong.
    pub fn check(&self, body: &[u8]) -> Result<(), String> {
        let widths: Vec<usize> = match self.route {
            Route::Openai => {
                let a: OpenAiAnswer = serde_json::from_slice(body).map_err(|e| e.to_string())?;
                if let Some((i, item)) = a.data.iter().enumerate().find(|(i, it)| it.index != *i) {
                    return Err(format!("data[{i}] has index {}", item.index));
                }
                let base64 = self.encoding == Encoding::Base64;
                if a.data.iter().any(|it| it.embedding.1 != base64) {
                    return Err(format!(
                        "an embedding is not in the {:?} encoding",
                        self.encoding
                    ));
                }
                a.data.into_iter().map(|it| it.embedding.0).collect()
            }
            Route::Tei => {
                let a: Vec<Vector> = serde_json::from_slice(body).map_err(|e| e.to_string())?;
                if a.iter().any(|v| v.1) {
                    return Err("TEI answers float lists, not base64".into());
                }
                a.into_iter().map(|v| v.0).collect()
            }
        };
        if widths.len() != self.inputs {
            return Err(format!(
                "{} embeddings for {} inputs",
                widths.len(),
                self.inputs
            ));
        }
        let first = widths[0];
        if first == 0 || widths.iter().any(|&w| w != first) {
            return Err(format!("embedding widths differ or are 0: {widths:?}"));
        }
        // The first well-formed answer sets the width if none was given.
        let dim = match self
            .dim
            .compare_exchange(0, first, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => first,
            Err(d) => d,
        };
        if first != dim {
            return Err(format!("embeddings of width {first}, expected {dim}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_count_order_width_and_values() {
        let e = Expect::new(Route::Openai, Encoding::Float, 2, None);
        let ok = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,1]},{"object":"embedding","index":1,"embedding":[1e-3,-2]}],"model":"m","usage":{}}"#;
        assert_eq!(e.check(ok), Ok(()));
        assert_eq!(e.dim(), 2);
        let wide = br#"{"data":[{"index":0,"embedding":[1,2,3]},{"index":1,"embedding":[1,2,3]}]}"#;
        assert!(e.check(wide).unwrap_err().contains("expected 2"));
        let one = br#"{"data":[{"index":0,"embedding":[1,2]}]}"#;
        assert!(e.check(one).unwrap_err().contains("1 embeddings for 2"));
        let order = br#"{"data":[{"index":1,"embedding":[1,2]},{"index":0,"embedding":[1,2]}]}"#;
        assert!(e.check(order).unwrap_err().contains("index"));
        assert!(e
            .check(br#"{"data":[{"index":0,"embedding":[1,"x"]}]}"#)
            .is_err());
        assert!(e.check(b"not json").is_err());

        let b64 = Expect::new(Route::Openai, Encoding::Base64, 1, Some(2));
        let v = base64::engine::general_purpose::STANDARD
            .encode([1f32.to_le_bytes(), 2f32.to_le_bytes()].concat());
        assert_eq!(
            b64.check(format!(r#"{{"data":[{{"index":0,"embedding":"{v}"}}]}}"#).as_bytes()),
            Ok(())
        );
        let nan = base64::engine::general_purpose::STANDARD
            .encode([1f32.to_le_bytes(), f32::NAN.to_le_bytes()].concat());
        assert!(b64
            .check(format!(r#"{{"data":[{{"index":0,"embedding":"{nan}"}}]}}"#).as_bytes())
            .is_err());
        assert!(b64
            .check(br#"{"data":[{"index":0,"embedding":[1,2]}]}"#)
            .unwrap_err()
            .contains("encoding"));

        let tei = Expect::new(Route::Tei, Encoding::Float, 2, Some(3));
        assert_eq!(tei.check(b"[[1,2,3],[4,5,6]]"), Ok(()));
        assert!(tei.check(b"[[1,2,3],[4,5]]").is_err());
        assert!(tei.check(b"[[1,2,3]]").is_err());
    }
}
