//! What a subcommand loads and where it runs it, as the command line names them: the [`Device`]
//! (`cpu` or `cuda:N`) and the [`ModelSource`] (a snapshot with its adapters, or the built-in
//! demo). Defined here, once, for every crate that loads a model.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A compute device: `cpu` (the f32 reference backend) or `cuda:N` (GPU ordinal `N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

/// A device name that is neither `cpu` nor `cuda:N`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a device: expected cpu or cuda:N (N a GPU ordinal, e.g. cuda:0)")]
pub struct ParseDeviceError(String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        if name == "cpu" {
            return Ok(Device::Cpu);
        }
        match name.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(ordinal)) => Ok(Device::Cuda(ordinal)),
            _ => Err(ParseDeviceError(name.to_string())),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// Where the weights come from: a snapshot and the adapters merged into it at load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSource {
    /// The base snapshot (config.json, safetensors, tokenizer.json).
    pub model_dir: PathBuf,
    /// Merged into the text model.
    pub text_adapter: Option<PathBuf>,
    /// Language modules merged into a second copy of the text model, vision modules into the
    /// vision tower: the screenshot path.
    pub multimodal_adapter: Option<PathBuf>,
    /// The built-in demo model (random weights, meaningless answers): its adapters were not asked
    /// for, they come with it.
    pub demo: bool,
}

/// Why a model source could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("adapters need --model (the demo model carries its own adapters)")]
    AdapterWithoutModel,
    #[error("writing the built-in demo model to {}: {source}", .dir.display())]
    Demo {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ModelSource {
    /// `model` with the adapters given, or, without `model`, the built-in demo model with both of
    /// its adapters, written under the temporary directory. Adapters without `model` are refused:
    /// they would silently not apply to the demo.
    pub fn resolve(
        model: Option<&Path>,
        text_adapter: Option<&Path>,
        multimodal_adapter: Option<&Path>,
    ) -> Result<Self, SourceError> {
        match model {
            Some(dir) => Ok(Self {
                model_dir: dir.to_path_buf(),
                text_adapter: text_adapter.map(Path::to_path_buf),
                multimodal_adapter: multimodal_adapter.map(Path::to_path_buf),
                demo: false,
            }),
            None if text_adapter.is_some() || multimodal_adapter.is_some() => {
                Err(SourceError::AdapterWithoutModel)
            }
            None => {
                let dir = std::env::temp_dir();
                let demo = crate::demo::materialize(&dir)
                    .map_err(|source| SourceError::Demo { dir, source })?;
                Ok(Self {
                    model_dir: demo.model_dir,
                    text_adapter: Some(demo.text_adapter_dir),
                    multimodal_adapter: Some(demo.multimodal_adapter_dir),
                    demo: true,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        for (name, device) in [
            ("cpu", Device::Cpu),
            ("cuda:0", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(name.parse::<Device>().unwrap(), device);
            assert_eq!(device.to_string(), name);
        }
        for bad in ["gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "CPU", ""] {
            let e = bad.parse::<Device>().unwrap_err().to_string();
            assert!(e.contains("expected cpu or cuda:N"), "{bad}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn a_model_keeps_the_adapters_given() {
        let s = ModelSource::resolve(Some(Path::new("/m")), None, Some(Path::new("/mm"))).unwrap();
        assert_eq!(
            s,
            ModelSource {
                model_dir: "/m".into(),
                text_adapter: None,
                multimodal_adapter: Some("/mm".into()),
                demo: false,
            }
        );
    }

    #[test]
    fn adapters_without_a_model_are_refused() {
        for (text, mm) in [
            (Some(Path::new("/t")), None),
            (None, Some(Path::new("/mm"))),
        ] {
            let e = ModelSource::resolve(None, text, mm).unwrap_err();
            assert!(matches!(e, SourceError::AdapterWithoutModel), "{e}");
        }
    }

    #[test]
    fn no_model_means_the_demo_with_both_adapters() {
        let s = ModelSource::resolve(None, None, None).unwrap();
        assert!(s.demo);
        assert!(s.model_dir.join("config.json").is_file());
        assert!(s.text_adapter.unwrap().is_dir());
        assert!(s.multimodal_adapter.unwrap().is_dir());
    }
}
