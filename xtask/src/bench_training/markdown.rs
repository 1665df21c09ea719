//! The summary as markdown: the tables BENCHMARKS.md records.

use serde_json::Value;

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().filter(|x| x.is_finite()).map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// "12.3 [11.0-14.2]", or "12.3" for one run, or "-".
fn spread(v: &Value, digits: usize) -> String {
    if v.is_null() {
        return "-".into();
    }
    let (m, lo, hi) = (num(&v["median"], digits), num(&v["min"], digits), num(&v["max"], digits));
    if v["n"].as_u64() == Some(1) || lo == hi {
        m
    } else {
        format!("{m} [{lo}-{hi}]")
    }
}

/// "1.32x [1.10-1.55], faster".
fn speedup(v: &Value) -> String {
    if v.is_null() {
        return "-".into();
    }
    let verdict = v["verdict"].as_str().map(|s| format!(", {s}")).unwrap_or_default();
    format!("{}x [{}-{}]{verdict}", num(&v["median"], 2), num(&v["min"], 2), num(&v["max"], 2))
}

fn time_to(c: &Value, target: &str) -> String {
    let t = &c["targets"][target];
    if t.is_null() {
        return "-".into();
    }
    let (reached, runs) = (t["reached"].as_u64().unwrap_or(0), c["runs"].as_u64().unwrap_or(0));
    match reached {
        0 => "never".into(),
        r if r < runs => format!("{} ({r} of {runs} runs)", spread(&t["time_s"], 1)),
        _ => spread(&t["time_s"], 1),
    }
}

fn utilization(c: &Value, target: &str) -> String {
    let u = &c["targets"][target]["utilization"];
    if u.is_null() {
        return "-".into();
    }
    let pct = |k: &str| u[k].as_f64().map_or("-".into(), |x| format!("{:.0}", x * 100.0));
    let of = match c["ceiling"].as_str() {
        Some(n) if n != super::report::CEILING => format!(" of {n}"),
        _ => String::new(),
    };
    format!("{}% [{}-{}]{of}", pct("median"), pct("min"), pct("max"))
}

pub fn markdown(s: &Value) -> String {
    let configs = s["configs"].as_array().cloned().unwrap_or_default();
    let tuned = if s["policies_tuned_on_it"].as_bool() == Some(true) {
        "the shipped policies were tuned on it"
    } else {
        "held out: the shipped policies were not tuned on it"
    };
    let mut out = format!(
        "### {} ({tuned}; {} repeat(s), configurations interleaved; every host starts with {})\n\n",
        s["scenario"].as_str().unwrap_or("?"),
        s["repeats"],
        s["host_cc"].as_str().unwrap_or("?")
    );
    if let Some(c) = s.get("calibration") {
        out += &format!(
            "Reference regime on this machine: batch {} per rank ({}; one rank's forward and \
             backward {} s a step at it, {} s at batch {}; the regime's is {} s).\n\n",
            c["batch"],
            c["how"].as_str().unwrap_or("?"),
            num(&c["compute_s"], 2),
            num(&c["compute_s_at_regime_batch"], 2),
            super::config::REFERENCE_BATCH,
            super::calibrate::REGIME_COMPUTE_S,
        );
    }
    let target = |b: &str| num(&s["targets"][b]["eval_loss"], 4);
    out += &format!(
        "Targets: each baseline's eval loss at {:.0}% of its day (median over its runs): untuned \
         {}, static {}. Eval noise: one evaluation of fixed parameters on {} windows moves by {} \
         nats (stdev over {} disjoint window sets; {} s of training at the static target); single \
         evaluations scatter {} nats around a run's monotone curve ({} s at the static target).\n\n",
        super::report::TARGET_AT * 100.0,
        target("untuned"),
        target("static"),
        s["eval_noise"]["windows"],
        spread(&s["eval_noise"]["stdev"], 4),
        s["eval_noise"]["sets"],
        spread(&s["time_resolution_s"]["window_sampling"], 1),
        spread(&s["eval_noise"]["curve_jitter"], 4),
        spread(&s["time_resolution_s"]["curve_jitter"], 1),
    );
    out += "| configuration | steps | time to static target (s) | vs static | time to untuned target (s) | vs untuned | compute utilization (static target / untuned target) | final eval loss | steps to static target | failed | decisions |\n\
            |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for c in &configs {
        let decisions = c["decisions"]
            .as_object()
            .map(|d| {
                d.iter()
                    .map(|(h, v)| format!("{h} {}", spread(v, 0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        out += &format!(
            "| {}{} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or("?"),
            match c["failed_runs"].as_array().map_or(0, Vec::len) {
                0 => String::new(),
                n => format!(" ({n} run(s) did not finish: failed-runs.jsonl)"),
            },
            spread(&c["steps"], 0),
            time_to(c, "static"),
            speedup(&c["targets"]["static"]["speedup"]),
            time_to(c, "untuned"),
            speedup(&c["targets"]["untuned"]["speedup"]),
            utilization(c, "static"),
            utilization(c, "untuned"),
            spread(&c["final_eval_loss"], 4),
            spread(&c["targets"]["static"]["steps"], 0),
            c["failed_collectives"].as_array().map_or(0, Vec::len),
            if decisions.is_empty() { "-".into() } else { decisions },
        );
    }
    out += &ladder(s, &configs);
    out += "\nLoss per step (eval loss at a step count, where every run got there):\n\n\
            | configuration | at 100 steps | at 200 steps | at 300 steps |\n|---|---:|---:|---:|\n";
    for c in &configs {
        let at = |n: &str| spread(&c["loss_at_steps"][n], 4);
        out += &format!(
            "| {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or("?"),
            at("100"),
            at("200"),
            at("300")
        );
    }
    out += "\nPer phase: steps/s, as a share of co-located, step time p50/p99 (s), WAN MB per \
            step, the codecs every rank reported (steps, all runs):\n\n\
            | configuration | phase | steps/s | of co-located | p50 | p99 | MB/step | codecs |\n\
            |---|---|---:|---:|---:|---:|---:|---|\n";
    for c in &configs {
        for p in c["phases"].as_array().into_iter().flatten() {
            let codecs = p["codecs"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                c["name"].as_str().unwrap_or("?"),
                p["phase"].as_str().unwrap_or("?"),
                spread(&p["steps_per_s"], 3),
                p["share_of_colocated"]
                    .as_f64()
                    .map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
                num(&p["step_p50_s"], 2),
                num(&p["step_p99_s"], 2),
                p["wan_bytes_per_step"].as_f64().map_or("-".into(), |b| format!("{:.2}", b / 1e6)),
                codecs,
            );
        }
    }
    out += &states_table(&configs);
    if let Some(oracle) = s["oracle"].as_array().filter(|o| !o.is_empty()) {
        out += "\nOracle (per phase, the fixed configuration with the most progress per second: \
                median steps/s x fewest steps to the static target / its steps to it):\n\n\
                | phase | configuration | steps/s | quality | progress/s |\n|---|---|---:|---:|---:|\n";
        for o in oracle {
            out += &format!(
                "| {} | {} | {} | {} | {} |\n",
                o["phase"].as_str().unwrap_or("?"),
                o["config"].as_str().unwrap_or("?"),
                spread(&o["steps_per_s"], 3),
                num(&o["quality"], 2),
                spread(&o["progress_per_s"], 3)
            );
        }
    }
    out += "\nTransport in force (read back from the kernel at the pass's end, first host; \
            `set here` = written in the initial namespace by the benchmark, where this kernel \
            applies it to every namespace):\n\n\
            | configuration | connections' CC | tcp_ecn | tcp_rmem | tcp_wmem | rmem_max / wmem_max | netdev_max_backlog | set here | same every repeat |\n\
            |---|---|---:|---|---|---|---|---|---|\n";
    for c in &configs {
        let t = &c["transport"];
        let hosts = &t["read_back"]["hosts"];
        let Some((_, h)) = hosts.as_object().and_then(|m| m.iter().next()) else { continue };
        let init = &t["read_back"]["initial_namespace"];
        let get = |v: &Value, k: &str| v[k].as_str().unwrap_or("-").to_owned();
        let cc = h["connections_cc"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k} x{v}")).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        let set = t["applied_in_initial_namespace"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        format!(
                            "{} {}",
                            k.rsplit('.').next().unwrap_or(k),
                            v.as_str().unwrap_or("?")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "-".into());
        out += &format!(
            "| {} | {} (default {}) | {} | {} | {} | {} / {} | {} (namespace: {}) | {} | {} |\n",
            c["name"].as_str().unwrap_or("?"),
            if cc.is_empty() { "-".into() } else { cc },
            get(h, "net.ipv4.tcp_congestion_control"),
            get(h, "net.ipv4.tcp_ecn"),
            get(h, "net.ipv4.tcp_rmem"),
            get(h, "net.ipv4.tcp_wmem"),
            get(h, "net.core.rmem_max"),
            get(h, "net.core.wmem_max"),
            get(init, "net.core.netdev_max_backlog"),
            get(h, "net.core.netdev_max_backlog"),
            set,
            if t["same_in_every_repeat"].as_bool() == Some(true) { "yes" } else { "no" },
        );
    }
    out
}

/// Seconds each host's daemon held each state, per phase (configurations with a daemon only).
fn states_table(configs: &[Value]) -> String {
    let mut out =
        "\nStates per phase (seconds each host's daemon held each state, from its decision \
                   log against the lab's clock; `-` before its first decision):\n\n\
                   | configuration | host | phase | states |\n|---|---|---|---|\n"
            .to_owned();
    let mut any = false;
    for c in configs {
        for (host, phases) in c["states"].as_object().into_iter().flatten() {
            for p in phases.as_array().into_iter().flatten() {
                let phase = p["phase"].as_str().unwrap_or("?");
                let held = p["states"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(state, s)| format!("{state} {}", spread(s, 0)))
                    .collect::<Vec<_>>()
                    .join(", ");
                out += &format!(
                    "| {} | {host} | {phase} | {held} |\n",
                    c["name"].as_str().unwrap_or("?")
                );
                any = true;
            }
        }
    }
    if any {
        out
    } else {
        String::new()
    }
}

/// The ladder of targets (co-located's loss at 25/50/75% of its day): time to each rung and the
/// speedup against the strongest fixed configuration, the loss at the day's end, and which
/// fixed configuration was best in hindsight.
fn ladder(s: &Value, configs: &[Value]) -> String {
    let rungs: Vec<(String, &Value)> = super::report::LADDER
        .iter()
        .map(|at| format!("rung-{:.0}", at * 100.0))
        .filter_map(|k| {
            let t = &s["targets"][&k];
            (!t.is_null()).then_some((k, t))
        })
        .collect();
    if rungs.is_empty() {
        return String::new();
    }
    let against = rungs[0].1["speedup_against"].as_str().unwrap_or("-");
    let mut out = format!(
        "\nThe ladder: co-located's eval loss at {} of its day; time to each rung (s) and the \
         speedup against {} (median [min-max] of runs; a speedup only where every run reached \
         the rung). Best fixed configuration in hindsight: {} ({}).\n\n",
        rungs
            .iter()
            .map(|(_, t)| format!(
                "{:.0}% ({})",
                t["at_share_of_day"].as_f64().unwrap_or(0.0) * 100.0,
                num(&t["eval_loss"], 4)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        against,
        s["best_fixed"]["name"].as_str().unwrap_or("none"),
        s["best_fixed"]["by"].as_str().unwrap_or("-"),
    );
    out += "| configuration |";
    for (k, _) in &rungs {
        out += &format!(" {k} (s) | vs {against} |");
    }
    out += " loss at the day's end |\n|---|";
    out += &"---:|---:|".repeat(rungs.len());
    out += "---:|\n";
    for c in configs {
        out += &format!("| {} |", c["name"].as_str().unwrap_or("?"));
        for (k, _) in &rungs {
            out += &format!(" {} | {} |", time_to(c, k), speedup(&c["targets"][k]["speedup"]));
        }
        out += &format!(" {} |\n", spread(&c["final_eval_loss"], 4));
    }
    out + &headroom(&rungs, configs, against)
}

/// Co-located's own speedup at each rung against the baseline: the most a configuration that
/// syncs every step could gain, and what one that syncs every H steps gains only by running
/// more steps a second than the ceiling.
fn headroom(rungs: &[(String, &Value)], configs: &[Value], against: &str) -> String {
    let Some(ceiling) = configs.iter().find(|c| c["name"] == super::report::CEILING) else {
        return String::new();
    };
    let gains: Vec<String> = rungs
        .iter()
        .map(|(k, _)| format!("{k} {}", speedup(&ceiling["targets"][k]["speedup"])))
        .collect();
    format!(
        "\nHeadroom: co-located against {against}, {}: no configuration gains more without \
         outrunning co-located's steps.\n",
        gains.join(", ")
    )
}
