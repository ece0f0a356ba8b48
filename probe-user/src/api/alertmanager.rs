//! Alertmanager's webhook payload (version 4, as its `webhook_config` receiver posts it) and
//! what this node does with it: a firing alert for its serving group asks for a deep dive of
//! its engine; anything else asks for nothing.
//!
//! Reference: Alertmanager's `notify/webhook` Message (`version`, `groupKey`, `status`,
//! `receiver`, `groupLabels`, `commonLabels`, `commonAnnotations`, `externalURL`, `alerts`).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The parts of a webhook call this node reads; the rest is ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// The payload's version; only "4" is known.
    pub version: String,
    /// The group's alerts, firing and resolved.
    pub alerts: Vec<AmAlert>,
}

/// One alert of the call.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AmAlert {
    /// `firing` or `resolved`.
    pub status: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When it started firing (RFC 3339), the same for every node it is sent to.
    #[serde(default)]
    pub starts_at: String,
}

impl AmAlert {
    /// Its start, ns since the epoch, if it parses.
    pub fn starts_at_unix_ns(&self) -> Option<u64> {
        let t = humantime::parse_rfc3339_weak(self.starts_at.trim_end_matches('Z')).ok()?;
        Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as u64)
    }
}

/// Why a call was refused as malformed.
#[derive(Debug, PartialEq, Eq)]
pub struct BadMessage(pub String);

/// Parses a webhook body.
pub fn parse(body: &[u8]) -> Result<Message, BadMessage> {
    let m: Message = serde_json::from_slice(body).map_err(|e| {
        BadMessage(format!(
            "not an Alertmanager webhook message ({e}): point a webhook_config receiver (payload version 4) at this URL"
        ))
    })?;
    if m.version != "4" {
        return Err(BadMessage(format!(
            "Alertmanager webhook payload version {:?} is not known (4 is)",
            m.version
        )));
    }
    Ok(m)
}

/// The firing alerts of `m` whose `label` names one of `groups`.
pub fn firing_for<'a>(
    m: &'a Message,
    label: &str,
    groups: &std::collections::BTreeSet<String>,
) -> Vec<&'a AmAlert> {
    m.alerts
        .iter()
        .filter(|a| a.status == "firing" && a.labels.get(label).is_some_and(|g| groups.contains(g)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(alerts: &str) -> String {
        format!(
            r#"{{"version":"4","groupKey":"{{}}:{{}}","status":"firing","receiver":"stallscope","groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"http://am:9093","truncatedAlerts":0,"alerts":[{alerts}]}}"#
        )
    }

    #[test]
    fn only_firing_alerts_of_this_group_count() {
        let a = |status: &str, group: Option<&str>| {
            let labels = group.map_or(String::new(), |g| format!(r#","serving_group":"{g}""#));
            format!(
                r#"{{"status":"{status}","labels":{{"alertname":"StallscopeStall"{labels}}},"annotations":{{}},"startsAt":"2026-11-26T12:00:00Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"f"}}"#
            )
        };
        for (alerts, group, want) in [
            (vec![a("firing", Some("g1"))], "g1", 1),
            (vec![a("firing", Some("g2"))], "g1", 0),
            (vec![a("resolved", Some("g1"))], "g1", 0),
            (vec![a("firing", None)], "g1", 0),
            (
                vec![a("firing", Some("g1")), a("firing", Some("g1"))],
                "g1",
                2,
            ),
            (vec![a("firing", Some("g1"))], "", 0),
        ] {
            let m = parse(message(&alerts.join(",")).as_bytes()).unwrap();
            let groups = [group.to_string()]
                .into_iter()
                .filter(|g| !g.is_empty())
                .collect();
            assert_eq!(
                firing_for(&m, "serving_group", &groups).len(),
                want,
                "{alerts:?} {group}"
            );
        }
    }

    #[test]
    fn start_instants_parse_to_the_nanosecond() {
        let a = |t: &str| AmAlert {
            status: "firing".into(),
            labels: BTreeMap::new(),
            starts_at: t.into(),
        };
        for (text, want) in [
            ("2026-11-26T12:00:00Z", Some(1_795_694_400_000_000_000)),
            (
                "2026-11-26T12:00:00.123456789Z",
                Some(1_795_694_400_123_456_789),
            ),
            ("", None),
            ("yesterday", None),
        ] {
            assert_eq!(a(text).starts_at_unix_ns(), want, "{text}");
        }
    }

    #[test]
    fn bad_bodies_say_what_is_expected() {
        for (body, says) in [
            ("not json", "webhook_config"),
            (r#"{"version":"3","alerts":[]}"#, "version"),
            (r#"{"alerts":[]}"#, "webhook_config"),
        ] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert!(e.0.contains(says), "{body}: {}", e.0);
        }
    }
}
