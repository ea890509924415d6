//! The value types of the method settings and of bounded numbers. Each checks itself when it is
//! parsed (`FromStr`, and `Deserialize` through it), so a bad value is reported at the value's own
//! location in a manifest and by the flag that gave it on a command line.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a setting's value is refused, in the words a manifest diagnostic or a flag's error shows.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("at least one denoising step is needed")]
    NoDenoisingStep,
    #[error("denoising step {0} is outside 1..=1000")]
    DenoisingStepOutside(i64),
    #[error("denoising steps must strictly decrease, e.g. [1000, 750, 500, 250]")]
    DenoisingStepsNotDecreasing,
    #[error("`{0}` is not a denoising step")]
    NotADenoisingStep(String),
    #[error("sigma {0} is out of range; use a value strictly between 0 and 1")]
    Sigma(f64),
    #[error("attention window {0} is out of range; use -1 (all frames) or a positive frame count")]
    AttentionWindow(i64),
    #[error("{value} is out of range; use a value in {min}..={max}")]
    OutOfBounds { value: i128, min: u64, max: u64 },
    #[error("{0} is out of range; use a positive number")]
    NotPositive(f64),
    #[error("`{0}` is not a number")]
    NotANumber(String),
    #[error("`{0}` is not an integer")]
    NotAnInteger(String),
    #[error("`{0}` is not a whole number")]
    NotAWholeNumber(String),
    #[error("`{0}` is not an SVD rank; use `none` or a positive integer")]
    SvdRank(String),
}

/// The timesteps of the denoising steps of one block, strictly decreasing, each in 1..=1000.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenoisingSteps(pub Vec<u32>);

impl DenoisingSteps {
    fn check(v: Vec<u32>) -> Result<Self, ValueError> {
        if v.is_empty() {
            return Err(ValueError::NoDenoisingStep);
        }
        if let Some(&bad) = v.iter().find(|&&s| s == 0 || s > 1000) {
            return Err(ValueError::DenoisingStepOutside(bad.into()));
        }
        if v.windows(2).any(|w| w[1] >= w[0]) {
            return Err(ValueError::DenoisingStepsNotDecreasing);
        }
        Ok(DenoisingSteps(v))
    }
}

impl Default for DenoisingSteps {
    fn default() -> Self {
        DenoisingSteps(vec![1000, 750, 500, 250])
    }
}

impl FromStr for DenoisingSteps {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim().trim_start_matches('[').trim_end_matches(']');
        let v = s
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| ValueError::NotADenoisingStep(p.trim().to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        DenoisingSteps::check(v)
    }
}

impl Serialize for DenoisingSteps {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for DenoisingSteps {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = DenoisingSteps;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of timesteps like [1000, 750, 500, 250]")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DenoisingSteps, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<DenoisingSteps, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<i64>()? {
                    let x = u32::try_from(x).map_err(|_| {
                        serde::de::Error::custom(ValueError::DenoisingStepOutside(x))
                    })?;
                    v.push(x);
                }
                DenoisingSteps::check(v).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for DenoisingSteps {
    fn schema_name() -> Cow<'static, str> {
        "DenoisingSteps".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "array",
            "items": { "type": "integer", "minimum": 1, "maximum": 1000 },
            "minItems": 1,
            "description": "Strictly decreasing timesteps of the denoising steps of each block."
        })
    }
}

/// The clean-cache noise level: a sigma strictly between 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Sigma(pub f64);

impl Sigma {
    fn check(v: f64) -> Result<Self, ValueError> {
        if v > 0.0 && v < 1.0 {
            Ok(Sigma(v))
        } else {
            Err(ValueError::Sigma(v))
        }
    }
}

impl FromStr for Sigma {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| ValueError::NotANumber(s.to_string()))?;
        Sigma::check(v)
    }
}

impl Serialize for Sigma {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Sigma {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Sigma;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number strictly between 0 and 1")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Sigma, E> {
                Sigma::check(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Sigma, E> {
                Sigma::check(v as f64).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Sigma, E> {
                Sigma::check(v as f64).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Sigma, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Sigma {
    fn schema_name() -> Cow<'static, str> {
        "Sigma".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1 })
    }
}

/// An attention window in latent frames: `-1` (all past frames) or a positive count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionWindow(pub i64);

impl AttentionWindow {
    fn check(v: i64) -> Result<Self, ValueError> {
        if v == -1 || v >= 1 {
            Ok(AttentionWindow(v))
        } else {
            Err(ValueError::AttentionWindow(v))
        }
    }
}

impl FromStr for AttentionWindow {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let v: i64 = s
            .trim()
            .parse()
            .map_err(|_| ValueError::NotAnInteger(s.to_string()))?;
        AttentionWindow::check(v)
    }
}

impl Serialize for AttentionWindow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for AttentionWindow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        AttentionWindow::check(v).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for AttentionWindow {
    fn schema_name() -> Cow<'static, str> {
        "AttentionWindow".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer",
            "minimum": -1,
            "not": { "const": 0 },
            "description": "Latent frames of past context each block attends to; -1 = all."
        })
    }
}

/// A bounded integer setting: its `Deserialize` rejects values outside `MIN..=MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bounded<const MIN: u64, const MAX: u64>(pub u64);

impl<const MIN: u64, const MAX: u64> Serialize for Bounded<MIN, MAX> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if v < MIN as i64 || v as u64 > MAX {
            return Err(serde::de::Error::custom(ValueError::OutOfBounds {
                value: v.into(),
                min: MIN,
                max: MAX,
            }));
        }
        Ok(Bounded(v as u64))
    }
}

impl<const MIN: u64, const MAX: u64> JsonSchema for Bounded<MIN, MAX> {
    fn schema_name() -> Cow<'static, str> {
        format!("Integer_{MIN}_{MAX}").into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer", "minimum": MIN, "maximum": MAX })
    }
}

/// A positive float (timestep shift).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Positive(pub f64);

impl Serialize for Positive {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if v > 0.0 && v.is_finite() {
            Ok(Positive(v))
        } else {
            Err(serde::de::Error::custom(ValueError::NotPositive(v)))
        }
    }
}

impl JsonSchema for Positive {
    fn schema_name() -> Cow<'static, str> {
        "Positive".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "number", "exclusiveMinimum": 0 })
    }
}

impl<const MIN: u64, const MAX: u64> FromStr for Bounded<MIN, MAX> {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s.trim().parse::<u64>() {
            Ok(v) if (MIN..=MAX).contains(&v) => Ok(Bounded(v)),
            Ok(value) => Err(ValueError::OutOfBounds {
                value: value.into(),
                min: MIN,
                max: MAX,
            }),
            Err(_) => Err(ValueError::NotAWholeNumber(s.to_string())),
        }
    }
}

impl FromStr for Positive {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s.trim().parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => Ok(Positive(v)),
            Ok(v) => Err(ValueError::NotPositive(v)),
            Err(_) => Err(ValueError::NotANumber(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denoising_steps() {
        assert_eq!(
            "1000,750,500,250".parse::<DenoisingSteps>().unwrap(),
            DenoisingSteps::default()
        );
        for bad in ["", "1000,1000", "250,500", "0", "1001"] {
            assert!(bad.parse::<DenoisingSteps>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sigmas_and_windows() {
        assert!("0.01".parse::<Sigma>().is_ok());
        for bad in ["0", "1", "-0.1", "x"] {
            assert!(bad.parse::<Sigma>().is_err(), "{bad}");
        }
        assert!("-1".parse::<AttentionWindow>().is_ok());
        assert!("0".parse::<AttentionWindow>().is_err());
    }

    #[test]
    fn bounded_and_positive_parse_in_range_only() {
        assert_eq!("3".parse::<Bounded<1, 64>>(), Ok(Bounded(3)));
        for bad in ["0", "65", "-1", "x"] {
            assert!(bad.parse::<Bounded<1, 64>>().is_err(), "{bad}");
        }
        assert_eq!("2.5".parse::<Positive>(), Ok(Positive(2.5)));
        for bad in ["0", "-1", "inf", "x"] {
            assert!(bad.parse::<Positive>().is_err(), "{bad}");
        }
    }
}
