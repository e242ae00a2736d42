//! JSON, written by hand (one line per object, the library's string escaper).

use crate::*;

/// `s` as a JSON string literal, quotes included (the library's one escaper).
pub(crate) fn json_string(s: &str) -> String {
    torch_arena::track::json::string(s)
}

/// A JSON object built field by field, in order.
pub(crate) struct JsonObject(String);

impl JsonObject {
    pub(crate) fn new() -> Self {
        JsonObject(String::from("{"))
    }

    pub(crate) fn raw(&mut self, key: &str, value: &str) -> &mut Self {
        if self.0.len() > 1 {
            self.0.push_str(", ");
        }
        self.0.push_str(&json_string(key));
        self.0.push_str(": ");
        self.0.push_str(value);
        self
    }

    pub(crate) fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.raw(key, &json_string(value))
    }

    pub(crate) fn num(&mut self, key: &str, value: u64) -> &mut Self {
        self.raw(key, &value.to_string())
    }

    pub(crate) fn opt_num(&mut self, key: &str, value: Option<u64>) -> &mut Self {
        match value {
            Some(v) => self.num(key, v),
            None => self.raw(key, "null"),
        }
    }

    /// A float; `null` when not finite (JSON has no NaN or infinity).
    pub(crate) fn float(&mut self, key: &str, value: f64) -> &mut Self {
        if value.is_finite() {
            self.raw(key, &format!("{value}"))
        } else {
            self.raw(key, "null")
        }
    }

    pub(crate) fn opt_float(&mut self, key: &str, value: Option<f64>) -> &mut Self {
        self.float(key, value.unwrap_or(f64::NAN))
    }

    pub(crate) fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.raw(key, if value { "true" } else { "false" })
    }

    pub(crate) fn finish(&mut self) -> String {
        let mut s = std::mem::take(&mut self.0);
        s.push('}');
        s
    }
}

/// Driver calls by kind as a JSON object: CUDA driver API name → count.
pub(crate) fn calls_json(c: &DriverCounters) -> String {
    let mut j = JsonObject::new();
    for (name, n) in c.entries() {
        j.num(name, n);
    }
    j.finish()
}

/// Steps as a JSON array (see `--json`).
pub(crate) fn steps_json(steps: &[StepStats]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|st| {
            JsonObject::new()
                .num("driver_calls", st.calls.total())
                .raw("driver_calls_by_kind", &calls_json(&st.calls))
                .float("modelled_driver_s", st.modelled_driver_s)
                .float("modelled_stall_s", st.modelled_stall_s)
                .num("peak_requested_bytes", st.peak_requested)
                .num("peak_reserved_bytes", st.peak_reserved)
                .finish()
        })
        .collect();
    format!("[{}]", items.join(", "))
}

pub(crate) fn oom_json(o: &OomReport) -> String {
    let largest: Vec<String> = o
        .largest_live
        .iter()
        .map(|(bytes, site)| {
            JsonObject::new()
                .num("bytes", *bytes)
                .str("site", site)
                .finish()
        })
        .collect();
    JsonObject::new()
        .num("event", o.event as u64)
        .num("size_bytes", o.size)
        .num("stream", o.stream)
        .num("live_bytes", o.live_bytes)
        .num("live_count", o.live_count)
        .num("reserved_bytes", o.reserved)
        .num("cached_bytes", o.cached)
        .str("message", &o.message)
        .raw("largest_live", &format!("[{}]", largest.join(", ")))
        .finish()
}
