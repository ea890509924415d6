//! Method settings that change what is generated, and the denoising schedule they imply.
//!
//! `MethodSettings` is what the generation loop reads of the method table
//! ([`crate::vocab::Method`], where each setting and its default is declared), in the loop's own
//! number types, with the noise seed.

pub use super::settings::Emit;
use crate::vocab::Method;

/// The method settings the generation loop reads (the flag and config classes).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MethodSettings {
    /// Noise level of the clean-cache pass (`--clean-sigma-override`).
    pub clean_sigma: f32,
    /// Denoising steps on the 1000-step training scale, highest first.
    pub denoising_steps: Vec<u32>,
    /// Warp the steps onto the shifted flow-matching schedule.
    pub warp_denoising_steps: bool,
    pub timestep_shift: f64,
    pub emit: Emit,
    /// Latent frames of past keys and values each block attends to; -1 means all of them and 0
    /// none (each block sees only itself).
    pub attention_window: i64,
    pub seed: u64,
}

impl MethodSettings {
    /// The settings of a method table and a noise seed.
    pub fn of(method: &Method, seed: u64) -> Self {
        Self {
            clean_sigma: method.clean_sigma.0 as f32,
            denoising_steps: method.denoising_steps.0.clone(),
            warp_denoising_steps: method.warp_denoising_steps,
            timestep_shift: method.timestep_shift.0,
            emit: method.emit,
            attention_window: method.attention_window.0,
            seed,
        }
    }
}

impl Default for MethodSettings {
    /// The method table's defaults, with seed 0.
    fn default() -> Self {
        Self::of(&Method::default(), 0)
    }
}

/// Settings the schedule cannot be built from.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScheduleError {
    #[error("denoising_steps is empty; give at least one step, e.g. [1000, 750, 500, 250]")]
    NoSteps,
    #[error("denoising step {0} is outside 1..=1000")]
    StepOutOfRange(u32),
    #[error("clean_sigma {0} is outside [0, 1]")]
    CleanSigmaOutOfRange(f32),
    #[error("timestep_shift {0} must be positive")]
    BadShift(f64),
    #[error("attention_window {0} must be -1 (all) or a number of latent frames (0 or more)")]
    BadWindow(i64),
}

/// One DiT pass's noise level: `sigma` for the scheduler maths and `timestep = 1000 * sigma` for
/// the graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoiseLevel {
    pub sigma: f32,
    pub timestep: f32,
}

impl NoiseLevel {
    fn from_sigma(sigma: f64) -> Self {
        Self {
            sigma: sigma as f32,
            timestep: (1000.0 * sigma) as f32,
        }
    }
}

/// The per-block schedule: the denoising steps, then the clean-cache pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub steps: Vec<NoiseLevel>,
    pub clean: NoiseLevel,
}

impl Schedule {
    pub fn new(settings: &MethodSettings) -> Result<Self, ScheduleError> {
        if settings.denoising_steps.is_empty() {
            return Err(ScheduleError::NoSteps);
        }
        // Written to also refuse NaN.
        if settings.timestep_shift.is_nan() || settings.timestep_shift <= 0.0 {
            return Err(ScheduleError::BadShift(settings.timestep_shift));
        }
        if !(0.0..=1.0).contains(&settings.clean_sigma) {
            return Err(ScheduleError::CleanSigmaOutOfRange(settings.clean_sigma));
        }
        if settings.attention_window < -1 {
            return Err(ScheduleError::BadWindow(settings.attention_window));
        }
        let shift = settings.timestep_shift;
        let steps = settings
            .denoising_steps
            .iter()
            .map(|&step| {
                if !(1..=1000).contains(&step) {
                    return Err(ScheduleError::StepOutOfRange(step));
                }
                let u = f64::from(step) / 1000.0;
                let sigma = if settings.warp_denoising_steps {
                    shift * u / (1.0 + (shift - 1.0) * u)
                } else {
                    u
                };
                Ok(NoiseLevel::from_sigma(sigma))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            steps,
            clean: NoiseLevel::from_sigma(f64::from(settings.clean_sigma)),
        })
    }

    /// Noise draws one block uses: one per denoising step plus the clean-cache pass.
    pub fn draws_per_block(&self) -> u32 {
        self.steps.len() as u32 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schedule_is_warped_with_shift_five() {
        let schedule = Schedule::new(&MethodSettings::default()).unwrap();
        let sigmas: Vec<f32> = schedule.steps.iter().map(|l| l.sigma).collect();
        // shift * u / (1 + 4u) for u = 1, 0.75, 0.5, 0.25.
        let expected = [1.0, 3.75 / 4.0, 2.5 / 3.0, 1.25 / 2.0];
        for (got, want) in sigmas.iter().zip(expected) {
            assert!((got - want as f32).abs() < 1e-7, "{got} vs {want}");
        }
        assert_eq!(schedule.steps[0].timestep, 1000.0);
        assert!((schedule.clean.sigma - 0.02).abs() < 1e-9);
        assert!((schedule.clean.timestep - 20.0).abs() < 1e-5);
        assert_eq!(schedule.draws_per_block(), 5);
    }

    #[test]
    fn unwarped_schedule_is_linear() {
        let settings = MethodSettings {
            warp_denoising_steps: false,
            ..MethodSettings::default()
        };
        let schedule = Schedule::new(&settings).unwrap();
        let timesteps: Vec<f32> = schedule.steps.iter().map(|l| l.timestep).collect();
        assert_eq!(timesteps, [1000.0, 750.0, 500.0, 250.0]);
    }

    #[test]
    fn bad_settings_are_rejected() {
        let cases: Vec<(MethodSettings, ScheduleError)> = vec![
            (
                MethodSettings {
                    denoising_steps: vec![],
                    ..Default::default()
                },
                ScheduleError::NoSteps,
            ),
            (
                MethodSettings {
                    denoising_steps: vec![1001],
                    ..Default::default()
                },
                ScheduleError::StepOutOfRange(1001),
            ),
            (
                MethodSettings {
                    clean_sigma: 1.5,
                    ..Default::default()
                },
                ScheduleError::CleanSigmaOutOfRange(1.5),
            ),
            (
                MethodSettings {
                    attention_window: -2,
                    ..Default::default()
                },
                ScheduleError::BadWindow(-2),
            ),
            (
                MethodSettings {
                    timestep_shift: 0.0,
                    ..Default::default()
                },
                ScheduleError::BadShift(0.0),
            ),
        ];
        for (settings, expected) in cases {
            assert_eq!(Schedule::new(&settings).unwrap_err(), expected);
        }
    }

    #[test]
    fn emit_parses_both_names() {
        assert_eq!("cache_pass".parse::<Emit>().unwrap(), Emit::CachePass);
        assert_eq!("denoised".parse::<Emit>().unwrap(), Emit::Denoised);
        assert!("x0".parse::<Emit>().is_err());
    }
}
