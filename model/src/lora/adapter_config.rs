//! `adapter_config.json` of a PEFT LoRA adapter, restricted to what merges exactly as
//! `W' = W + scale · B · A` into the base weights. Every option that changes that formula, adds
//! trainable tensors beyond A/B, or presumes a modified base is refused with its name.

use anyhow::{bail, ensure, Context, Result};
use serde_json::{Map, Value};

/// Which modules the adapter was configured for (used to cross-check the stored keys).
#[derive(Clone, Debug, PartialEq)]
pub enum TargetModules {
    /// Module names; PEFT matches a module whose path equals one or ends with `.` + one.
    Names(Vec<String>),
    /// A regular expression (PEFT full-matches it against the module path), or `all-linear`.
    /// Not re-evaluated here; the stored keys are still checked against the model.
    Pattern(String),
}

/// The parts of `adapter_config.json` that matter for an exact merge.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// LoRA rank: the inner dimension of every A/B pair.
    pub r: usize,
    pub lora_alpha: f64,
    /// rsLoRA scales by alpha/√r instead of alpha/r.
    pub use_rslora: bool,
    pub target_modules: TargetModules,
    /// Module names PEFT was told to skip.
    pub exclude_modules: Vec<String>,
    /// Decoder layers the adapter is restricted to, if any.
    pub layers_to_transform: Option<Vec<usize>>,
    pub base_model_name_or_path: Option<String>,
    pub task_type: Option<String>,
}

impl AdapterConfig {
    /// Parses and vets `adapter_config.json` text.
    pub fn from_json(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text).context("not valid JSON")?;
        let obj = root.as_object().context("not a JSON object")?;
        let peft_type = obj.get("peft_type").and_then(Value::as_str);
        ensure!(
            peft_type == Some("LORA"),
            "peft_type is {}, only LORA adapters are supported",
            peft_type.map_or("missing".to_string(), |t| format!("{t:?}"))
        );
        refuse_unmergeable(obj)?;

        let r = obj
            .get("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .context("`r` must be a positive integer")? as usize;
        let lora_alpha = obj
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .context("`lora_alpha` must be a number")?;
        let use_rslora = flag(obj, "use_rslora")?;
        let target_modules = match obj.get("target_modules") {
            Some(Value::String(s)) => TargetModules::Pattern(s.clone()),
            Some(Value::Array(_)) => TargetModules::Names(strings(obj, "target_modules")?),
            other => bail!("`target_modules` must be a list or a string, found {other:?}"),
        };
        let exclude_modules = match obj.get("exclude_modules") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(_)) => strings(obj, "exclude_modules")?,
            Some(other) => bail!(
                "`exclude_modules` as a pattern ({other}) is not supported; list the module names"
            ),
        };
        let layers_to_transform = match obj.get("layers_to_transform") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(vec![n
                .as_u64()
                .context("`layers_to_transform` must hold layer indices")?
                as usize]),
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|v| v.as_u64().map(|i| i as usize))
                    .collect::<Option<Vec<_>>>()
                    .context("`layers_to_transform` must hold layer indices")?,
            ),
            Some(other) => bail!("`layers_to_transform` must be an index or a list, found {other}"),
        };
        let text_field = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_string);
        Ok(Self {
            r,
            lora_alpha,
            use_rslora,
            target_modules,
            exclude_modules,
            layers_to_transform,
            base_model_name_or_path: text_field("base_model_name_or_path"),
            task_type: text_field("task_type"),
        })
    }

    /// The factor on `B·A`, as PEFT computes it: alpha/r, or alpha/√r with rsLoRA.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }

    /// Whether `target_modules`/`exclude_modules` select the module at `path` (a dotted path
    /// such as `model.layers.3.mlp.gate_proj`). A pattern is taken as selecting everything.
    pub fn selects(&self, path: &str) -> bool {
        let matches = |name: &String| path == name || path.ends_with(&format!(".{name}"));
        let targeted = match &self.target_modules {
            TargetModules::Names(names) => names.iter().any(matches),
            TargetModules::Pattern(_) => true,
        };
        targeted && !self.exclude_modules.iter().any(matches)
    }
}

/// Options whose adapters are not plain `W + scale·B·A`, with why.
fn refuse_unmergeable(obj: &Map<String, Value>) -> Result<()> {
    let is_set = |key: &str| match obj.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    };
    const REFUSED: &[(&str, &str)] = &[
        (
            "use_dora",
            "DoRA rescales each column by a learned magnitude",
        ),
        (
            "modules_to_save",
            "it stores fully trained copies of whole modules",
        ),
        ("lora_bias", "it adds a trained bias to LoRA B"),
        (
            "trainable_token_indices",
            "it stores trained embedding rows",
        ),
        ("rank_pattern", "per-module ranks are not supported"),
        ("alpha_pattern", "per-module alphas are not supported"),
        ("layer_replication", "it duplicates decoder layers"),
        (
            "target_parameters",
            "it adapts raw parameters rather than Linear modules",
        ),
        (
            "alora_invocation_tokens",
            "activated LoRA applies only after its invocation tokens and cannot be merged",
        ),
        ("use_qalora", "QALoRA pools inputs before A"),
        (
            "megatron_config",
            "Megatron-parallel LoRA layers are not supported",
        ),
        ("velora_config", "VeLoRA variants are not supported"),
        ("monteclora_config", "MonteCLoRA samples its weights"),
        (
            "use_bdlora",
            "block-diagonal LoRA factors are not supported",
        ),
        ("arrow_config", "Arrow routes between adapters per token"),
        (
            "kasa_config",
            "KaSA inserts a learned diagonal and truncates the base",
        ),
    ];
    for (key, why) in REFUSED {
        ensure!(!is_set(key), "`{key}` is set: cannot merge exactly ({why})");
    }
    match obj.get("bias") {
        None | Some(Value::Null) => {}
        Some(Value::String(b)) if b == "none" => {}
        Some(other) => {
            bail!("`bias` is {other}: only \"none\" merges exactly (a trained bias would be lost)")
        }
    }
    match obj.get("init_lora_weights") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        // These only choose the random start of A/B; the base stays untouched.
        Some(Value::String(s)) if ["gaussian", "orthogonal", "eva"].contains(&s.as_str()) => {}
        Some(other) => bail!(
            "`init_lora_weights` is {other}: that initialisation modifies the base weights (or is a LoRA variant), so the adapter does not apply to the original base"
        ),
    }
    Ok(())
}

fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => bail!("`{key}` must be true or false, found {other}"),
    }
}

fn strings(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>> {
    obj.get(key)
        .and_then(Value::as_array)
        .and_then(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .with_context(|| format!("`{key}` must be a list of strings"))
}
