//! Policies built in code, from parts, for the tests and benchmarks: what a caller sets
//! differently is said in its call, and the rest (a 100 ms tick, the lab's link toward the US
//! host, the usual knobs) is written once. The output is the TOML an operator would write, so
//! a caller may still edit it as text, and it goes through the same parser and checks as a file.

/// The healthy state's knobs most tests use: no compression, DSCP 26, RoCE class 106.
pub const PLAIN: (&str, u8, u8) = ("none", 26, 106);

/// A policy under construction: top-level tables first, then links and states in call order.
#[derive(Clone, Debug)]
pub struct PolicyToml {
    head: String,
    body: String,
}

impl Default for PolicyToml {
    fn default() -> Self {
        Self::new()
    }
}

impl PolicyToml {
    /// `[daemon] tick = "100ms"` and nothing else yet.
    pub fn new() -> Self {
        Self { head: "\n[daemon]\ntick = \"100ms\"\n".into(), body: String::new() }
    }

    /// Another top-level table, as TOML (`"[host]\ntcp_ecn = 1"`).
    pub fn table(mut self, toml: &str) -> Self {
        self.head += toml.trim_matches('\n');
        self.head += "\n";
        self
    }

    /// `[hysteresis]`: entered after 300 ms, left after `exit_after`, at least `min_dwell` in a
    /// state.
    pub fn hysteresis(self, exit_after: &str, min_dwell: &str) -> Self {
        self.table(&format!(
            "[hysteresis]\nenter_after = \"300ms\"\nexit_after = \"{exit_after}\"\nmin_dwell = \
             \"{min_dwell}\""
        ))
    }

    /// A link on `iface` (capacity as the policy writes it, e.g. `"50Mbit/s"`, or `""` for none:
    /// measured) with one peer (`name`, `cidr`) or none.
    pub fn link(self, name: &str, iface: &str, capacity: &str, peer: Option<(&str, &str)>) -> Self {
        let link = self.link_on(name, &[iface], capacity);
        match peer {
            Some((peer, cidr)) => link.peer(peer, cidr),
            None => link,
        }
    }

    /// A link on several interfaces, with no peer yet.
    pub fn link_on(mut self, name: &str, ifaces: &[&str], capacity: &str) -> Self {
        let ifaces: Vec<String> = ifaces.iter().map(|i| format!("\"{i}\"")).collect();
        self.body +=
            &format!("[[link]]\nname = \"{name}\"\ninterfaces = [{}]\n", ifaces.join(", "));
        if !capacity.is_empty() {
            self.body += &format!("capacity = \"{capacity}\"\n");
        }
        self
    }

    /// A peer of the link just added.
    pub fn peer(self, name: &str, cidr: &str) -> Self {
        self.raw(&format!("[[link.peer]]\nname = \"{name}\"\ncidrs = [\"{cidr}\"]"))
    }

    /// The lab's WAN link seen from Hong Kong: "wan" on eth0 toward peer "us" (198.18.2.0/24).
    pub fn lab_link(self, capacity: &str) -> Self {
        self.link("wan", "eth0", capacity, Some(("us", "198.18.2.0/24")))
    }

    /// A state: its enter and exit conditions (the inline tables' bodies, `""` for none) and its
    /// knobs (compression, DSCP, RoCE traffic class).
    pub fn state(mut self, name: &str, enter: &str, exit: &str, knobs: (&str, u8, u8)) -> Self {
        self.body += &format!("[[state]]\nname = \"{name}\"\n");
        if !enter.is_empty() {
            self.body += &format!("enter = {{ {enter} }}\n");
        }
        if !exit.is_empty() {
            self.body += &format!("exit = {{ {exit} }}\n");
        }
        let (compression, dscp, class) = knobs;
        self.raw(&format!(
            "[state.knobs]\ncompression = \"{compression}\"\ndscp = {dscp}\nroce_traffic_class = \
             {class}"
        ))
    }

    /// "healthy" with [`PLAIN`] knobs.
    pub fn healthy(self) -> Self {
        self.state("healthy", "", "", PLAIN)
    }

    /// "congested": entered at 1% CE, left under 0.2%, int8 with `dscp` and `class`.
    pub fn congested_on_ce(self, dscp: u8, class: u8) -> Self {
        self.state(
            "congested",
            "ce_fraction = \"1%\"",
            "ce_fraction = \"0.2%\"",
            ("int8", dscp, class),
        )
    }

    /// TOML appended as it is (a `[state.transport]` of the state just added, a link's peers).
    pub fn raw(mut self, toml: &str) -> Self {
        self.body += toml.trim_matches('\n');
        self.body += "\n";
        self
    }

    pub fn build(&self) -> String {
        format!("{}{}", self.head, self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_make_the_toml_an_operator_writes() {
        let p = PolicyToml::new()
            .table("[host]\ntcp_ecn = 1")
            .lab_link("50Mbit/s")
            .healthy()
            .congested_on_ce(10, 42)
            .build();
        let parsed = crate::control::policy::Policy::parse(&p, "<test>").expect("valid");
        assert_eq!(parsed.states.len(), 2);
        assert!(
            p.starts_with("\n[daemon]\ntick = \"100ms\"\n[host]\ntcp_ecn = 1\n[[link]]\n"),
            "{p}"
        );
        assert!(p.contains("enter = { ce_fraction = \"1%\" }\n"), "{p}");
    }
}
