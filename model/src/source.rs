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
#[error(
    "{0:?} is not a device: expected cpu or cuda:N (N a GPU ordinal, e.g. cuda:0; `serve` also \
     takes a list such as cuda:0,cuda:1, or cuda:all)"
)]
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

/// The devices `serve` runs engines on, as `--device` names them: `cpu`; one or more `cuda:N`
/// separated by commas, one engine per entry (an ordinal may repeat: two engines, each with its
/// own weights, on one GPU); or `cuda:all`, every GPU the driver lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Devices {
    Cpu,
    Cuda(Vec<usize>),
    AllCuda,
}

impl Devices {
    /// The devices, one per engine (`cpu` once: its engine count is a separate setting), with
    /// `cuda:all` expanded by `gpu_count` (asked only then).
    pub fn resolve(
        &self,
        gpu_count: impl FnOnce() -> anyhow::Result<usize>,
    ) -> anyhow::Result<Vec<Device>> {
        match self {
            Devices::Cpu => Ok(vec![Device::Cpu]),
            Devices::Cuda(ordinals) => Ok(ordinals.iter().map(|&o| Device::Cuda(o)).collect()),
            Devices::AllCuda => {
                let n = gpu_count()?;
                anyhow::ensure!(n > 0, "--device cuda:all: the driver lists no GPU");
                Ok((0..n).map(Device::Cuda).collect())
            }
        }
    }
}

impl FromStr for Devices {
    type Err = ParseDeviceError;

    fn from_str(names: &str) -> Result<Self, Self::Err> {
        match names {
            "cpu" => return Ok(Devices::Cpu),
            "cuda:all" => return Ok(Devices::AllCuda),
            _ => {}
        }
        let bad = || ParseDeviceError(names.to_string());
        let mut ordinals = Vec::new();
        for name in names.split(',') {
            match name.trim().parse::<Device>() {
                Ok(Device::Cuda(ordinal)) => ordinals.push(ordinal),
                // `cpu` in a list, an empty entry, or not a device at all.
                _ => return Err(bad()),
            }
        }
        Ok(Devices::Cuda(ordinals))
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::Cpu => f.write_str("cpu"),
            Devices::AllCuda => f.write_str("cuda:all"),
            Devices::Cuda(ordinals) => {
                let names: Vec<String> = ordinals.iter().map(|o| format!("cuda:{o}")).collect();
                f.write_str(&names.join(","))
            }
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
    fn device_lists_parse_resolve_and_print_back() {
        let no_gpus = || -> anyhow::Result<usize> { panic!("asked for the GPU count") };
        for (names, devices, resolved) in [
            ("cpu", Devices::Cpu, vec![Device::Cpu]),
            ("cuda:1", Devices::Cuda(vec![1]), vec![Device::Cuda(1)]),
            (
                "cuda:0,cuda:1",
                Devices::Cuda(vec![0, 1]),
                vec![Device::Cuda(0), Device::Cuda(1)],
            ),
            (
                "cuda:0,cuda:0",
                Devices::Cuda(vec![0, 0]),
                vec![Device::Cuda(0), Device::Cuda(0)],
            ),
        ] {
            let parsed = names.parse::<Devices>().unwrap();
            assert_eq!(parsed, devices, "{names}");
            assert_eq!(parsed.to_string(), names);
            assert_eq!(parsed.resolve(no_gpus).unwrap(), resolved);
        }
        assert_eq!(
            " cuda:2 , cuda:3".parse::<Devices>().unwrap(),
            Devices::Cuda(vec![2, 3])
        );
        let all = "cuda:all".parse::<Devices>().unwrap();
        assert_eq!(all, Devices::AllCuda);
        assert_eq!(all.to_string(), "cuda:all");
        assert_eq!(
            all.resolve(|| Ok(3)).unwrap(),
            vec![Device::Cuda(0), Device::Cuda(1), Device::Cuda(2)]
        );
        assert!(all.resolve(|| Ok(0)).is_err(), "no GPU at all is an error");
        for bad in [
            "",
            "gpu",
            "cpu,cuda:0",
            "cuda:0,cpu",
            "cuda:0,",
            ",cuda:1",
            "cuda:all,cuda:0",
            "cuda:x",
        ] {
            let e = bad.parse::<Devices>().unwrap_err().to_string();
            assert!(e.contains("expected cpu or cuda:N"), "{bad}: {e}");
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
