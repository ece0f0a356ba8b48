//! Watch specs: `MODULE:QUALNAME[name=EXPR;...]`, where EXPR is an attribute path starting at a parameter name,
//! optionally wrapped in `len(...)` or `sum(...)` (a dict sums its values).

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ring::MAX_FIELDS;

/// How an extracted value is reduced to an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// The value itself (`int(value)`).
    None,
    /// `len(value)`.
    Len,
    /// `sum(value)`, or `sum(value.values())` for a dict.
    Sum,
}

/// One `name=EXPR` of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Field {
    /// Output name.
    pub name: String,
    /// The parameter the path starts at.
    pub param: String,
    /// Attributes taken in turn from the parameter.
    pub attrs: Vec<String>,
    /// Reduction.
    pub agg: Aggregate,
}

/// A parsed watch spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchSpec {
    /// The spec as written.
    pub text: String,
    /// Dotted module path (`__main__` allowed).
    pub module: String,
    /// Dotted qualified name inside the module, e.g. `EngineCore.step`.
    pub qualname: String,
    /// Extracted fields, at most [`MAX_FIELDS`].
    pub fields: Vec<Field>,
}

/// The function a spec watches, `module:qualname` (the spec without its field list).
pub fn func_of(spec: &str) -> &str {
    spec.split('[').next().unwrap_or(spec)
}

impl std::str::FromStr for WatchSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: &str| Error::BadSpec {
            spec: text.to_string(),
            why: why.to_string(),
        };
        let (target, fields_text) = match text.find('[') {
            Some(i) => {
                let rest = &text[i + 1..];
                let inner = rest
                    .strip_suffix(']')
                    .ok_or_else(|| bad("the field list must end with ']'"))?;
                (&text[..i], Some(inner))
            }
            None => (text, None),
        };
        let (module, qualname) = target
            .split_once(':')
            .ok_or_else(|| bad("missing ':' between module and function"))?;
        if !dotted(module) {
            return Err(bad(
                "the module must be a dotted name such as vllm.v1.engine.core",
            ));
        }
        if !dotted(qualname) {
            return Err(bad(
                "the function must be a dotted qualified name such as EngineCore.step",
            ));
        }
        let mut fields = Vec::new();
        for part in fields_text
            .unwrap_or("")
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (name, expr) = part
                .split_once('=')
                .ok_or_else(|| bad("each field is name=EXPR"))?;
            let name = name.trim();
            if !ident(name) {
                return Err(bad(&format!("field name {name:?} is not an identifier")));
            }
            if fields.iter().any(|f: &Field| f.name == name) {
                return Err(bad(&format!("field {name:?} appears twice")));
            }
            fields.push(parse_expr(name, expr.trim()).map_err(|why| bad(&why))?);
        }
        if fields.len() > MAX_FIELDS {
            return Err(bad(&format!("at most {MAX_FIELDS} fields per function")));
        }
        Ok(WatchSpec {
            text: text.to_string(),
            module: module.to_string(),
            qualname: qualname.to_string(),
            fields,
        })
    }
}

fn parse_expr(name: &str, expr: &str) -> std::result::Result<Field, String> {
    let (agg, path) =
        if let Some(inner) = expr.strip_prefix("len(").and_then(|e| e.strip_suffix(')')) {
            (Aggregate::Len, inner.trim())
        } else if let Some(inner) = expr.strip_prefix("sum(").and_then(|e| e.strip_suffix(')')) {
            (Aggregate::Sum, inner.trim())
        } else {
            (Aggregate::None, expr)
        };
    if !dotted(path) {
        return Err(format!("{expr:?} is not an attribute path like param.attr.attr (calls other than len/sum are not allowed)"));
    }
    let mut parts = path.split('.').map(str::to_string);
    let param = parts.next().unwrap_or_default();
    Ok(Field {
        name: name.to_string(),
        param,
        attrs: parts.collect(),
        agg,
    })
}

fn ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch == '_' || ch.is_ascii_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
}

fn dotted(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_examples() {
        let s: WatchSpec = "vllm.v1.engine.core:EngineCore.step[tokens=scheduler_output.total_num_scheduled_tokens]".parse().unwrap();
        assert_eq!(s.module, "vllm.v1.engine.core");
        assert_eq!(s.qualname, "EngineCore.step");
        assert_eq!(
            s.fields,
            vec![Field {
                name: "tokens".into(),
                param: "scheduler_output".into(),
                attrs: vec!["total_num_scheduled_tokens".into()],
                agg: Aggregate::None
            }]
        );
        let s: WatchSpec =
            "__main__:Sched.run_batch[bs=len(batch.reqs); seq=sum(batch.seq_lens);n=n]"
                .parse()
                .unwrap();
        assert_eq!(s.fields.len(), 3);
        assert_eq!(s.fields[0].agg, Aggregate::Len);
        assert_eq!(s.fields[1].attrs, vec!["seq_lens"]);
        assert_eq!(s.fields[2].attrs, Vec::<String>::new());
        let plain: WatchSpec = "m:f".parse().unwrap();
        assert!(plain.fields.is_empty());
    }

    #[test]
    fn rejects_malformed_specs_with_a_reason() {
        for (spec, why) in [
            ("nocolon", "missing ':'"),
            ("m:f[x=a.b", "must end with ']'"),
            ("m:f[x=a.b()]", "not an attribute path"),
            ("m:f[x=max(a)]", "not an attribute path"),
            ("m:f[1x=a]", "not an identifier"),
            ("m:f[x=a;x=b]", "appears twice"),
            ("m:f[a=a;b=b;c=c;d=d;e=e;f=f;g=g;h=h;i=i]", "at most 8"),
            ("m-x:f", "dotted name"),
        ] {
            let err = spec.parse::<WatchSpec>().unwrap_err().to_string();
            assert!(err.contains(why), "{spec}: {err}");
        }
    }
}
