//! Expected outcomes as JSON patterns: a value matches itself; `"$name"` binds a variable on
//! first use and must equal it after; `"*"` matches anything present; an object matches when
//! each of its fields matches (fields the pattern leaves out are not checked; a field missing
//! counts as `null`); `{"$gt": p}`, `{"$ge": p}`, `{"$lt": p}`, `{"$ne": p}` compare numbers or
//! values, `{"$one_of": [p, …]}` matches any of them, `{"$prefix": "text"}` a string's start,
//! `{"$len": n}` an array's length, and `{"$has": p}` an array with an element matching `p`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Variables bound while a scenario runs.
pub type Vars = BTreeMap<String, Value>;

/// Whether `actual` matches `pattern`; new variables are bound in `vars` only on a match.
/// `Err` says what differed.
pub fn matches(pattern: &Value, actual: &Value, vars: &mut Vars) -> Result<(), String> {
    let mut bound = vars.clone();
    check(pattern, actual, &mut bound, "")?;
    *vars = bound;
    Ok(())
}

fn variable(pattern: &Value) -> Option<&str> {
    pattern.as_str().filter(|text| text.len() > 1 && text.starts_with('$'))
}

/// `pattern` with every bound variable replaced by its value (unbound ones stay).
pub fn substitute(pattern: &Value, vars: &Vars) -> Value {
    match pattern {
        Value::String(text) => match variable(pattern).and_then(|name| vars.get(&name[1..])) {
            Some(value) => value.clone(),
            None => Value::String(text.clone()),
        },
        Value::Array(items) => Value::Array(items.iter().map(|i| substitute(i, vars)).collect()),
        Value::Object(fields) => {
            Value::Object(fields.iter().map(|(k, v)| (k.clone(), substitute(v, vars))).collect())
        }
        other => other.clone(),
    }
}

fn number(value: &Value) -> Option<f64> {
    value.as_f64().or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

fn integer(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

fn compare(op: &str, expected: &Value, actual: &Value, at: &str) -> Result<(), String> {
    // Fences exceed 2^53: compare as integers when both are.
    let ordering = match (integer(expected), integer(actual)) {
        (Some(x), Some(a)) => a.cmp(&x),
        _ => match (number(expected), number(actual)) {
            (Some(x), Some(a)) => a.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal),
            _ => return Err(format!("{at}: {op} needs numbers, got {actual} against {expected}")),
        },
    };
    let ok = match op {
        "$gt" => ordering.is_gt(),
        "$ge" => ordering.is_ge(),
        "$lt" => ordering.is_lt(),
        _ => ordering.is_le(),
    };
    if ok { Ok(()) } else { Err(format!("{at}: expected {op} {expected}, got {actual}")) }
}

fn check(pattern: &Value, actual: &Value, vars: &mut Vars, at: &str) -> Result<(), String> {
    if let Some(name) = variable(pattern) {
        let name = &name[1..];
        return match vars.get(name) {
            Some(bound) if bound == actual => Ok(()),
            Some(bound) => Err(format!("{at}: expected ${name} = {bound}, got {actual}")),
            None if actual.is_null() => {
                Err(format!("{at}: expected a value for ${name}, got null"))
            }
            None => {
                vars.insert(name.to_owned(), actual.clone());
                Ok(())
            }
        };
    }
    match pattern {
        Value::String(star) if star == "*" => {
            if actual.is_null() {
                Err(format!("{at}: expected a value, got null"))
            } else {
                Ok(())
            }
        }
        Value::Object(fields) if fields.len() == 1 && fields.keys().all(|k| k.starts_with('$')) => {
            let (op, operand) = fields.iter().next().expect("one field");
            let operand = substitute(operand, vars);
            match op.as_str() {
                "$gt" | "$ge" | "$lt" | "$le" => compare(op, &operand, actual, at),
                "$ne" => {
                    if check(&operand, actual, &mut vars.clone(), at).is_ok() {
                        Err(format!("{at}: expected anything but {operand}, got {actual}"))
                    } else {
                        Ok(())
                    }
                }
                "$one_of" => {
                    let options = operand.as_array().cloned().unwrap_or_default();
                    for option in &options {
                        let mut tried = vars.clone();
                        if check(option, actual, &mut tried, at).is_ok() {
                            *vars = tried;
                            return Ok(());
                        }
                    }
                    Err(format!("{at}: expected one of {operand}, got {actual}"))
                }
                "$prefix" => match (actual.as_str(), operand.as_str()) {
                    (Some(text), Some(start)) if text.starts_with(start) => Ok(()),
                    _ => Err(format!("{at}: expected a string starting {operand}, got {actual}")),
                },
                "$len" => match actual.as_array() {
                    Some(items) if Some(items.len() as u64) == operand.as_u64() => Ok(()),
                    _ => Err(format!("{at}: expected {operand} elements, got {actual}")),
                },
                "$has" => {
                    for item in actual.as_array().into_iter().flatten() {
                        let mut tried = vars.clone();
                        if check(&operand, item, &mut tried, at).is_ok() {
                            *vars = tried;
                            return Ok(());
                        }
                    }
                    Err(format!("{at}: expected an element matching {operand}, got {actual}"))
                }
                other => Err(format!("{at}: unknown operator {other}")),
            }
        }
        Value::Object(fields) => {
            for (name, expected) in fields {
                let value = actual.get(name).unwrap_or(&Value::Null);
                check(expected, value, vars, &format!("{at}.{name}"))?;
            }
            Ok(())
        }
        Value::Array(items) => {
            let Some(values) = actual.as_array() else {
                return Err(format!("{at}: expected an array, got {actual}"));
            };
            if values.len() != items.len() {
                return Err(format!("{at}: expected {pattern}, got {actual}"));
            }
            for (index, (expected, value)) in items.iter().zip(values).enumerate() {
                check(expected, value, vars, &format!("{at}[{index}]"))?;
            }
            Ok(())
        }
        expected if expected == actual => Ok(()),
        // Numbers as the server's INFO text gives them.
        Value::Number(n) if actual.as_str() == Some(n.to_string().as_str()) => Ok(()),
        _ => Err(format!("{at}: expected {pattern}, got {actual}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn try_match(pattern: Value, actual: Value) -> Result<Vars, String> {
        let mut vars = Vars::new();
        matches(&pattern, &actual, &mut vars).map(|()| vars)
    }

    #[test]
    fn a_variable_binds_once_and_must_agree_after() {
        let mut vars = Vars::new();
        matches(&json!({"fence": "$f"}), &json!({"fence": 7, "token": "t"}), &mut vars).unwrap();
        assert_eq!(vars["f"], json!(7));
        assert!(matches(&json!("$f"), &json!(8), &mut vars).is_err());
        assert!(matches(&json!({"$gt": "$f"}), &json!(8), &mut vars).is_ok());
        assert!(matches(&json!({"$gt": "$f"}), &json!(7), &mut vars).is_err());
    }

    #[test]
    fn a_wrong_answer_never_matches() {
        assert!(
            try_match(json!({"ok": {"released": true}}), json!({"ok": {"released": false}}))
                .is_err()
        );
        assert!(try_match(json!({"error": {"kind": "stale"}}), json!({"ok": {}})).is_err());
        assert!(try_match(json!("*"), json!(null)).is_err());
        assert!(try_match(json!({"$one_of": ["a", "b"]}), json!("c")).is_err());
        assert!(try_match(json!([1, 2]), json!([1, 2, 3])).is_err());
        assert!(try_match(json!({"$has": {"token": "x"}}), json!([{"token": "y"}])).is_err());
        assert!(try_match(json!({"owner": "x"}), json!(null)).is_err());
    }

    #[test]
    fn fences_above_two_to_the_53_compare_exactly() {
        let mut vars = Vars::new();
        vars.insert("f".into(), json!(9_007_199_254_740_993u64));
        assert!(
            matches(&json!({"$gt": "$f"}), &json!(9_007_199_254_740_994u64), &mut vars).is_ok()
        );
        assert!(
            matches(&json!({"$gt": "$f"}), &json!(9_007_199_254_740_993u64), &mut vars).is_err()
        );
    }

    #[test]
    fn info_text_numbers_match_numbers() {
        assert!(
            try_match(json!({"dlock_acquire_granted": 1}), json!({"dlock_acquire_granted": "1"}))
                .is_ok()
        );
        assert!(
            try_match(json!({"dlock_acquire_granted": 1}), json!({"dlock_acquire_granted": "2"}))
                .is_err()
        );
    }
}
