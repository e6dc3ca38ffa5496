//! The configuration's rules, one test each.

use super::redis::RedisTarget;
use quotad_core::OnFull;

use super::*;

fn memory(config: &Config) -> &MemorySettings {
    match &config.store().backend {
        BackendSettings::Memory(memory) => memory,
        other => panic!("expected the memory store, got {other:?}"),
    }
}

fn error(text: &str) -> String {
    match Config::from_toml(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_file_gives_the_documented_defaults() {
    let config = Config::default();
    assert_eq!(config.server().grpc_addr.to_string(), "127.0.0.1:50051");
    assert_eq!(config.server().admin_addr.to_string(), "127.0.0.1:9464");
    assert!(config.server().tls.is_none());
    assert_eq!(config.server().config_poll_interval, Duration::from_secs(1));
    let memory = memory(&config);
    assert_eq!(memory.store.max_keys(), 1_000_000);
    assert_eq!(memory.store.shards(), 64);
    assert_eq!(memory.store.on_full(), OnFull::Deny);
    assert_eq!(memory.sweep_interval, Duration::from_secs(10));
    assert_eq!(config.store().max_key_bytes, 256);
    assert_eq!(config.store().on_error, OnError::Error);
    assert!(config.limits().allow_inline_policies);
    assert!(config.policies().is_empty());
}

#[test]
fn reads_every_section() {
    let config = Config::from_toml(
        r#"
        [server]
        grpc_addr = "0.0.0.0:7000"
        admin_addr = "0.0.0.0:7001"
        config_poll_interval = "0s"

        [store]
        backend = "memory"
        max_keys = 5000
        shards = 16
        on_full = "evict"
        max_key_bytes = 64
        sweep_interval = "2s"

        [limits]
        allow_inline_policies = false

        [policies.api]
        algorithm = "token_bucket"
        limit = 100
        window = "1m"
        burst = 20
        "#,
    )
    .expect("valid");
    assert_eq!(
        config.server().grpc_addr,
        ListenAddr::Tcp("0.0.0.0:7000".parse().expect("an address"))
    );
    assert_eq!(config.server().config_poll_interval, Duration::ZERO);
    assert_eq!(memory(&config).store.on_full(), OnFull::Evict);
    assert_eq!(memory(&config).store.shards(), 16);
    assert_eq!(config.store().max_key_bytes, 64);
    assert!(!config.limits().allow_inline_policies);
    let api = config.policies()["api"].policy;
    assert_eq!(api.window_ms(), 60_000);
    assert_eq!(api.burst(), 20);
}

#[test]
fn names_the_policy_field_and_line_of_a_broken_rule() {
    let text = "\n[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n";
    assert_eq!(
        error(text),
        "policies.login.limit: limit must be at least 1 (line 4)"
    );
    let text =
        "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nburst = 3\n";
    assert_eq!(
        error(text),
        "policies.login.burst: burst applies only to token_bucket and leaky_bucket, not fixed_window (line 5)"
    );
    let text = "[policies.login]\nalgorithm = \"fixed\"\nlimit = 5\nwindow = \"1m\"\n";
    assert!(error(text).starts_with("policies.login.algorithm: unknown algorithm \"fixed\""));
    let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"0s\"\n";
    assert_eq!(
        error(text),
        "policies.login.window: window must be at least 1 ms (line 4)"
    );
    let text = "[policies.log]\nalgorithm = \"sliding_log\"\nlimit = 10001\nwindow = \"1s\"\n";
    assert!(error(text).starts_with("policies.log.limit: sliding_log limit must be at most 10000"));
}

#[test]
fn lease_settings_are_off_by_default_and_validated_when_given() {
    let config = Config::from_toml(
        r#"
        [policies.plain]
        algorithm = "fixed_window"
        limit = 5
        window = "1m"

        [policies.leased]
        algorithm = "fixed_window"
        limit = 100
        window = "1m"
        lease = { max_units = 20, min_units = 5, max_ttl = "10s" }

        [policies.table]
        algorithm = "sliding_window"
        limit = 100
        window = "1m"

        [policies.table.lease]
        max_units = 30
        max_ttl = "1s"
        "#,
    )
    .expect("valid");
    assert_eq!(config.policies()["plain"].lease, None);
    let terms = |name: &str| {
        let t = config.policies()[name].lease.expect("lease settings");
        (t.max_units(), t.min_units(), t.max_ttl_ms())
    };
    assert_eq!(terms("leased"), (20, 5, 10_000));
    assert_eq!(terms("table"), (30, 1, 1_000), "min_units defaults to 1");
    let limits = Config::default().limits().clone();
    assert_eq!(limits.lease_max_units, 1_000);
    assert_eq!(limits.lease_max_ttl, Duration::from_secs(10));
}

#[test]
fn names_the_lease_field_and_line_of_a_broken_rule() {
    let policy = |lease: &str| {
        format!(
            "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n{lease}\n"
        )
    };
    for (lease, expected) in [
        (
            "lease = { max_units = 0, max_ttl = \"1s\" }",
            "policies.api.lease.max_units: lease.max_units must be at least 1 (line 5)",
        ),
        (
            "lease = { max_units = 10, min_units = 11, max_ttl = \"1s\" }",
            "policies.api.lease.min_units: lease.min_units must be from 1 to lease.max_units (10), got 11 (line 5)",
        ),
        (
            "lease = { max_units = 10, max_ttl = \"2d\" }",
            "policies.api.lease.max_ttl: lease.max_ttl must be from 1ms to 1d (line 5)",
        ),
        (
            "\n[policies.api.lease]\nmax_units = 9007199254740993\nmax_ttl = \"1s\"",
            "policies.api.lease.max_units: lease.max_units must be at most 2^53 (line 7)",
        ),
    ] {
        assert_eq!(error(&policy(lease)), expected, "{lease}");
    }
    let message = error(&policy("lease = { max_units = 10 }"));
    assert!(
        message.starts_with("policies.api.lease: missing field `max_ttl`"),
        "{message}"
    );
    let message = error(&policy(
        "lease = { max_units = 10, max_ttl = \"1s\", ttl = 3 }",
    ));
    assert!(
        message.starts_with("policies.api.lease.ttl: unknown field `ttl`"),
        "{message}"
    );
    let message = error(&policy("lease = { max_units = 10, max_ttl = \"soon\" }"));
    assert!(
        message.starts_with("policies.api.lease.max_ttl: invalid duration"),
        "{message}"
    );
    assert!(message.ends_with("(line 5)"), "{message}");
}

#[test]
fn names_the_field_of_a_type_or_parse_error() {
    let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = -1\nwindow = \"1m\"\n";
    let message = error(text);
    assert!(message.starts_with("policies.login.limit: "), "{message}");
    assert!(message.ends_with("(line 3)"), "{message}");

    let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"a minute\"\n";
    let message = error(text);
    assert!(
        message.starts_with("policies.login.window: invalid duration"),
        "{message}"
    );
    assert!(message.ends_with("(line 4)"), "{message}");

    let message = error("[server]\ngrpc_addr = \"localhost\"\n");
    assert!(message.starts_with("server.grpc_addr: "), "{message}");

    let message = error("[store]\non_full = \"drop\"\n");
    assert!(
        message.starts_with("store.on_full: unknown variant `drop`"),
        "{message}"
    );

    let message = error("[store]\nbackend = \"memcached\"\n");
    assert!(
        message.starts_with("store.backend: unknown variant `memcached`"),
        "{message}"
    );

    let message = error("[store]\nbackend = \"redis\"\n");
    assert_eq!(
        message,
        "store.backend: \"redis\" needs a [store.redis] section with url or cluster_nodes (line 2)"
    );

    let message = error("[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\n");
    assert!(
        message.starts_with("policies.login: missing field `window`"),
        "{message}"
    );
}

#[test]
fn rejects_unknown_fields_everywhere() {
    for (text, field) in [
        ("colour = 1\n", "colour: unknown field `colour`"),
        // Keys that are not bare are named as written: quoted.
        ("\"\" = 1\n", "\"\": unknown field ``"),
        (
            "[server]\n\"a.b\" = 1\n",
            "server.\"a.b\": unknown field `a.b`",
        ),
        (
            "[server]\ngrpc_adr = \"127.0.0.1:1\"\n",
            "server.grpc_adr: unknown field `grpc_adr`",
        ),
        (
            "[store]\nmax_key = 5\n",
            "store.max_key: unknown field `max_key`",
        ),
        (
            "[limits]\ninline = true\n",
            "limits.inline: unknown field `inline`",
        ),
        (
            "[server.tls]\ncrt = \"a\"\n",
            "server.tls.crt: unknown field `crt`",
        ),
        (
            "[policies.a]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nlimti = 2\n",
            "policies.a.limti: unknown field `limti`",
        ),
    ] {
        let message = error(text);
        assert!(message.starts_with(field), "{message}");
    }
}

#[test]
fn validates_store_settings() {
    assert_eq!(
        error("[store]\nmax_keys = 0\n"),
        "store.max_keys: max_keys must be at least 1 (line 2)"
    );
    assert_eq!(
        error("[store]\nshards = 3\n"),
        "store.shards: shards must be a power of two from 1 to 65536 (got 3) (line 2)"
    );
    assert!(
        error("[store]\nshards = 131072\n").starts_with(
            "store.shards: shards must be a power of two from 1 to 65536 (got 131072)"
        )
    );
    assert_eq!(
        error("[store]\nmax_key_bytes = 0\n"),
        "store.max_key_bytes: max_key_bytes must be from 1 to 65536 (line 2)"
    );
    assert_eq!(
        error("[store]\nsweep_interval = \"0s\"\n"),
        "store.sweep_interval: sweep_interval must be longer than zero (line 2)"
    );
}

#[test]
fn validates_redis_settings() {
    let redis = |line: &str| {
        error(&format!(
            "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://127.0.0.1:6379\"\n{line}\n"
        ))
    };
    assert_eq!(
        redis("max_atomic_items = 3"),
        "store.redis.max_atomic_items: max_atomic_items must be at least 4 (one sliding log) (line 6)"
    );
    assert_eq!(
        redis("reconnect_after_timeouts = 0"),
        "store.redis.reconnect_after_timeouts: reconnect_after_timeouts must be at least 1 (line 6)"
    );
    for prefix in ["", "{team}", "a|b", "two words"] {
        assert!(
            redis(&format!("key_prefix = {prefix:?}")).starts_with(&format!(
                "store.redis.key_prefix: {prefix:?}: must be non-empty, without braces"
            )),
            "{prefix:?}"
        );
    }
}

#[test]
fn worker_threads_default_to_one_per_core_and_must_be_positive() {
    assert_eq!(Config::default().server().worker_threads, None);
    let config = Config::from_toml("[server]\nworker_threads = 1\n").expect("valid");
    assert_eq!(config.server().worker_threads, Some(1));
    assert_eq!(
        error("[server]\nworker_threads = 0\n"),
        "server.worker_threads: worker_threads must be at least 1 (leave it out for one per core) (line 2)"
    );
}

#[test]
fn rejects_policy_names_outside_the_allowed_alphabet() {
    let message =
        error("[policies.\"a:b\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n");
    assert!(
        message.starts_with("policies.\"a:b\": policy name must be"),
        "{message}"
    );
    let message =
        error("[policies.inline]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n");
    assert!(
        message.starts_with("policies.inline: policy name \"inline\" is reserved"),
        "{message}"
    );
    let long = "x".repeat(65);
    let message = error(&format!(
        "[policies.{long}]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n"
    ));
    assert!(message.contains("policy name must be"), "{message}");
    assert!(
        Config::from_toml(&format!(
            "[policies.\"{}\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n",
            "A-z_0.9".repeat(9).chars().take(64).collect::<String>()
        ))
        .is_ok()
    );
}

#[test]
fn reports_syntax_errors_with_their_line() {
    let message = error("[store]\nmax_keys = = 3\n");
    assert!(message.starts_with("invalid TOML: "), "{message}");
    assert!(message.ends_with("(line 2)"), "{message}");
}

#[test]
fn overrides_replace_file_values_and_say_so_in_errors() {
    let flags = FlagValues::new()
        .with("store.max_keys", "7000")
        .with("store.on_full", "evict")
        .with("limits.allow_inline_policies", "false");
    let config =
        Config::parse("[store]\nmax_keys = 5\n", None, &flags, Files::Check).expect("valid");
    assert_eq!(memory(&config).store.max_keys(), 7_000);
    assert_eq!(memory(&config).store.on_full(), OnFull::Evict);
    assert!(!config.limits().allow_inline_policies);

    let flags = FlagValues::new().with("store.shards", "6");
    let message = match Config::parse("[store]\nshards = 8\n", None, &flags, Files::Check) {
        Ok(_) => panic!("6 shards is invalid"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        message,
        "store.shards: shards must be a power of two from 1 to 65536 (got 6) (from a flag or environment variable)"
    );
}

#[test]
fn tls_needs_readable_files() {
    let message =
        error("[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"\n");
    assert!(
        message.starts_with("server.tls.cert: cannot read /nonexistent/cert.pem"),
        "{message}"
    );
    assert!(message.ends_with("(line 2)"), "{message}");
    let message = error("[server.tls]\ncert = \"/nonexistent/cert.pem\"\n");
    assert!(
        message.starts_with("server.tls.key: key is required"),
        "{message}"
    );
}

#[test]
fn tls_rejects_files_that_are_not_pem() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, "not a certificate").expect("write");
    std::fs::write(&key, "not a key").expect("write");
    let text = format!("[server.tls]\ncert = {:?}\nkey = {:?}\n", cert, key);
    let message = error(&text);
    assert!(
        message.starts_with("server.tls.cert: ") && message.contains("holds no PEM certificate"),
        "{message}"
    );
    assert!(message.ends_with("(line 2)"), "{message}");

    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("a self-signed certificate");
    std::fs::write(&cert, generated.cert.pem()).expect("write");
    let message = error(&text);
    assert!(
        message.starts_with("server.tls.key: ") && message.contains("not a PEM private key"),
        "{message}"
    );
    std::fs::write(&key, generated.signing_key.serialize_pem()).expect("write");
    assert!(Config::from_toml(&text).is_ok());
}

#[test]
fn a_policy_reload_reads_no_tls_file() {
    // A reload validates the file without the certificates, which may be
    // in the middle of a rotation.
    let text = "[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"\n";
    assert!(Config::parse(text, None, &FlagValues::default(), Files::Skip).is_ok());
    assert!(Config::parse(text, None, &FlagValues::default(), Files::Check).is_err());
}

#[test]
fn lists_settings_that_need_a_restart() {
    let a = Config::from_toml("[store]\nmax_keys = 10\n").expect("valid");
    let b = Config::from_toml("[store]\nmax_keys = 20\n[limits]\nallow_inline_policies = false\n")
        .expect("valid");
    // [limits] reload with the policies; the store's bounds do not.
    assert_eq!(a.restart_required_changes(&b), vec!["store.max_keys"]);
    let c = Config::from_toml("[server.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n");
    assert!(c.is_err(), "the files do not exist");
    let c = Config::parse(
        "[server.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n",
        None,
        &FlagValues::default(),
        Files::Skip,
    )
    .expect("valid without reading the files");
    assert_eq!(
        Config::default().restart_required_changes(&c),
        vec!["server.tls.cert", "server.tls.key"]
    );
    assert!(a.restart_required_changes(&a.clone()).is_empty());
}

#[test]
fn every_setting_has_its_own_flag_and_variable_and_takes_its_default_as_an_override() {
    let mut flags = std::collections::BTreeSet::new();
    for setting in settings::all().filter(|s| s.kind != Kind::Table) {
        assert!(
            flags.insert(setting.flag()),
            "flag {} twice",
            setting.flag()
        );
        assert_eq!(
            setting.env(),
            format!("QUOTAD_{}", setting.flag().to_uppercase().replace('-', "_"))
        );
        assert!(!setting.help().is_empty(), "{} has no help", setting.path);
        if let Some(default) = setting.default {
            let flags = FlagValues::new().with(setting.path, default);
            let table = setting.path.rsplit_once('.').map_or("", |(t, _)| t);
            let config = match Config::parse("", None, &flags, Files::Skip) {
                Ok(config) => config,
                // Creating a table that needs more than this setting (a
                // snapshot path) is refused for the table's sake only.
                Err(e)
                    if e.field()
                        .is_some_and(|f| f.starts_with(table) && table.contains('.')) =>
                {
                    continue;
                }
                Err(e) => panic!("{}: its default as a flag: {e}", setting.path),
            };
            // The same value as the default; at most, it created its table
            // (whose other settings then take their defaults).
            let changes = Config::default().restart_required_changes(&config);
            assert!(
                changes.iter().all(
                    |p| *p == setting.path || p.rsplit_once('.').map(|(t, _)| t) == Some(table)
                ),
                "{changes:?}"
            );
        }
    }
}

#[test]
fn the_example_config_names_every_setting() {
    let example = include_str!("../../config/quotad.example.toml");
    for setting in settings::all() {
        let name = setting
            .path
            .rsplit('.')
            .next()
            .expect("a path has a last part");
        assert!(
            example.contains(&format!("{name} ="))
                || example.contains(&format!("[{}]", setting.path)),
            "config/quotad.example.toml does not mention {}",
            setting.path
        );
    }
    Config::from_toml(example).expect("the example config is valid");
}

#[test]
fn max_bytes_takes_human_sizes_and_refuses_a_budget_too_small_to_use() {
    let config = Config::from_toml("[store]\nmax_bytes = \"1GiB\"\n").expect("valid");
    assert_eq!(memory(&config).store.max_bytes(), Some(1 << 30));
    let config = Config::from_toml("[store]\nmax_bytes = 100000000\n").expect("valid");
    assert_eq!(memory(&config).store.max_bytes(), Some(100_000_000));
    assert_eq!(
        memory(&Config::default()).store.max_bytes(),
        Some(512 << 20)
    );
    let message = error("[store]\nmax_bytes = \"1KiB\"\n");
    assert!(message.starts_with("store.max_bytes: "), "{message}");
    assert!(message.ends_with("(line 2)"), "{message}");
    let message = error("[store]\nmax_bytes = \"lots\"\n");
    assert!(message.starts_with("store.max_bytes: "), "{message}");
}

#[test]
fn the_grpc_address_may_be_a_unix_socket_with_a_mode() {
    let config = Config::from_toml(
        "[server]\ngrpc_addr = \"unix:///run/quotad/grpc.sock\"\nunix_socket_mode = \"0600\"\n",
    )
    .expect("valid");
    assert_eq!(
        config.server().grpc_addr,
        ListenAddr::Unix(PathBuf::from("/run/quotad/grpc.sock"))
    );
    assert_eq!(config.server().unix_socket_mode, 0o600);
    assert_eq!(
        "unix:relative.sock".parse::<ListenAddr>(),
        Ok(ListenAddr::Unix(PathBuf::from("relative.sock")))
    );
    assert_eq!(Config::default().server().unix_socket_mode, 0o660);
    assert!(error("[server]\ngrpc_addr = \"unix://\"\n").starts_with("server.grpc_addr: "));
    assert!(
        error("[server]\nunix_socket_mode = \"0999\"\n").starts_with("server.unix_socket_mode: ")
    );
    let tls = "[server]\ngrpc_addr = \"unix:///q.sock\"\n[server.tls]\ncert = \"c\"\nkey = \"k\"\n";
    assert!(
        error(tls).starts_with("server.tls: TLS is for a TCP grpc_addr"),
        "{}",
        error(tls)
    );
}

#[test]
fn a_duration_written_as_a_bare_number_is_refused_with_the_way_to_write_it() {
    let message =
        error("[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = 60000\n");
    assert!(
        message.contains("policies.api.window: a duration is written as text with its unit: \"60000ms\" or \"60000s\", not 60000"),
        "{message}"
    );
    assert!(message.contains("line 4"), "{message}");
    let message = error("[store]\nsweep_interval = 1.5\n");
    assert!(
        message.contains("store.sweep_interval: a duration is written as text"),
        "{message}"
    );
    let message = error("[store]\nsweep_interval = true\n");
    assert!(
        message.contains("a duration written as text with its unit"),
        "{message}"
    );
}

/// Every value the example config shows, commented out or not, is the
/// setting's default where it has one (the file says so at its top).
#[test]
fn the_example_configs_values_are_the_defaults() {
    let example = include_str!("../../config/quotad.example.toml");
    let value = |text: &str| -> toml::Value {
        toml::from_str::<toml::Table>(&format!("v = {text}"))
            .map(|mut t| t.remove("v").expect("v"))
            .unwrap_or_else(|_| toml::Value::String(text.to_owned()))
    };
    let mut section = String::new();
    let mut checked = 0;
    for line in example.lines() {
        let line = line.trim_start_matches('#').trim();
        let header = line.split(" #").next().unwrap_or(line).trim();
        if let Some(header) = header.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header.to_owned();
            continue;
        }
        let Some((key, rest)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        // A settings section (not [policies.NAME] or a prose line): every
        // key it shows is a setting.
        let in_settings = settings::find(&section).is_some_and(|s| s.kind == Kind::Table);
        let path = format!("{section}.{key}");
        let Some(setting) = settings::find(&path) else {
            assert!(
                !in_settings || rest.trim().is_empty(),
                "the example shows {path}, which is no setting"
            );
            continue;
        };
        let shown = rest.split(" #").next().unwrap_or(rest).trim();
        let Some(default) = setting.default else {
            continue;
        };
        assert_eq!(
            value(shown),
            value(default),
            "{}: the example shows {shown}, the default is {default}",
            setting.path
        );
        checked += 1;
    }
    assert!(checked > 40, "only {checked} values checked");
}

#[test]
fn sentinel_needs_the_masters_url_and_excludes_a_cluster() {
    let redis = |body: &str| format!("[store]\nbackend = \"redis\"\n\n[store.redis]\n{body}\n");
    let config = Config::from_toml(&redis(
        "url = \"redis://:pw@quotad-main/2\"\nsentinel_nodes = [\"redis://127.0.0.1:26379\", \"redis://127.0.0.1:26380\"]",
    ))
    .expect("valid sentinel config");
    let BackendSettings::Redis(settings) = &config.store().backend else {
        panic!("redis")
    };
    assert!(matches!(
        &settings.target,
        RedisTarget::Sentinel { master, sentinels } if master == "redis://:pw@quotad-main/2" && sentinels.len() == 2
    ));
    assert!(
        !settings.target.to_string().contains("pw@"),
        "{}",
        settings.target
    );
    assert!(
        error(&redis("sentinel_nodes = [\"redis://127.0.0.1:26379\"]"))
            .contains("store.redis.url: with sentinel_nodes, url names the master set"),
    );
    assert!(
        error(&redis("url = \"redis://m/0\"\nsentinel_nodes = []"))
            .contains("store.redis.sentinel_nodes: must name at least one sentinel"),
    );
    assert!(
        error(&redis(
            "cluster_nodes = [\"redis://a:1\"]\nsentinel_nodes = [\"redis://127.0.0.1:26379\"]"
        ))
        .contains("set cluster_nodes or sentinel_nodes, not both"),
    );
    assert!(
        error(&redis(
            "url = \"redis://m/0\"\nsentinel_nodes = [\"http://x\"]"
        ))
        .contains("store.redis.sentinel_nodes"),
    );
}
