//! `torch-arena synth`: write a synthetic trace.

use crate::convert::write_trace;
use crate::out::CliResult;

use crate::args::{SynthArgs, SynthSpec, usage_of};
use crate::text::{fmt_bytes, fmt_count};
use crate::usage::{DEFAULT_CAPACITY, DEFAULT_SEED};

pub(crate) fn synth_command(a: SynthArgs) -> CliResult<u8> {
    let (capacity, n, max, seed, out) = (a.capacity, a.n, a.max, a.seed, a.output);
    let Some(kind) = a.kind else {
        return Err(format!(
            "synth: which trace? KIND is adversarial or rmm-random\n{}",
            usage_of("synth")
        ));
    };
    let spec = match kind.as_str() {
        "adversarial" => {
            if n.is_some() || max.is_some() || seed.is_some() {
                return Err("synth adversarial takes --capacity only (--n, --max and --seed are for rmm-random)".into());
            }
            SynthSpec::Adversarial {
                capacity: capacity.unwrap_or(DEFAULT_CAPACITY),
            }
        }
        "rmm-random" => {
            if capacity.is_some() {
                return Err("synth rmm-random takes --n, --max and --seed (--capacity is for adversarial; give it to replay)".into());
            }
            let (Some(n), Some(max)) = (n, max) else {
                return Err(format!(
                    "synth rmm-random needs --n N and --max SIZE\n{}",
                    usage_of("synth")
                ));
            };
            SynthSpec::checked_rmm(n, max, seed.unwrap_or(DEFAULT_SEED))
                .map_err(|e| format!("synth rmm-random: {e}"))?
        }
        spec if spec.starts_with("synth:") => SynthSpec::parse(spec)?,
        other => {
            return Err(format!(
                "synth: unknown KIND '{other}'; accepted: adversarial, rmm-random\n{}",
                usage_of("synth")
            ));
        }
    };
    let Some(out) = out else {
        return Err(format!(
            "synth: -o FILE is required (where to write the trace)\n{}",
            usage_of("synth")
        ));
    };
    let trace = spec.build();
    write_trace(&trace, &out)?;
    outln!(
        "wrote {}: {} events, peak requested {}",
        out.display(),
        fmt_count(trace.events.len() as u64),
        fmt_bytes(trace.peak_requested())
    )?;
    Ok(0)
}
