//! The shared protocol vectors (`protocol/vectors/*.json`), as every Rust test that checks a
//! rule against them reads them: the protocol crate's, the module's and the client's.

use std::path::Path;

pub use serde_json::Value;

/// The parsed JSON of `protocol/vectors/<file>`.
pub fn load(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/vectors").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A list of vectors.
pub fn list(value: &Value) -> &Vec<Value> {
    value.as_array().unwrap_or_else(|| panic!("a list of vectors, not {value}"))
}

/// The string field `name` of a vector.
pub fn text<'a>(vector: &'a Value, name: &str) -> &'a str {
    vector[name].as_str().unwrap_or_else(|| panic!("{name} of {vector}"))
}
