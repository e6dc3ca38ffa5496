//! Where RLS hits are counted: the state namespace (the store's policy
//! name) and the key within it.
//!
//! - A configured rule counts under `rls:<domain>/<level>/<level>...`, one
//!   level per descriptor entry on the path to the rule: `<key>` for a
//!   rule entry without a value, `<key>=<value>` with one (a wildcard value
//!   keeps its `*`). Every rule has a namespace of its own, so two rules
//!   never share state, and a reload that changes a rule's numbers but not
//!   its place keeps its counts, as the reference (which keys by the
//!   descriptor alone) does.
//! - A request's `limit` override counts under `rls:<domain>#<unit>`: the
//!   reference keys an override by domain, descriptor and window, not by
//!   its `requests_per_unit`, so requests that send different numbers for
//!   the same descriptor and unit share one count.
//! - The key is the descriptor as sent, `<key>=<value>|<key>=<value>...`,
//!   with the wildcard pattern in place of the value for an entry matched
//!   by a `share_threshold` wildcard (so all its values share one count).
//!
//! Names, keys and values are written with `%`, `/`, `=`, `|`, `#`, `{`,
//! `}`, space and control characters percent-encoded, so each string reads
//! back one way only: distinct rules and descriptors never meet under one
//! name and key. The `rls:` prefix holds a `:`, which named policies may not
//! contain, and differs from inline policies' `inline:`, so RLS state never
//! meets quotad.v1 state. No raw brace reaches the store, so a Redis Cluster
//! hash tag is always the whole key.

use std::fmt::Write;

use compact_str::CompactString;

use super::Unit;

/// The prefix of every RLS state namespace.
pub const NAMESPACE_PREFIX: &str = "rls:";

/// Whether `byte` is written percent-encoded. Every reserved character is
/// ASCII, so a byte of a multi-byte character never is.
fn reserved(byte: u8) -> bool {
    matches!(byte, b'%' | b'/' | b'=' | b'|' | b'#' | b'{' | b'}' | b' ') || byte.is_ascii_control()
}

/// Appends `text` with the reserved characters percent-encoded, copying the
/// runs between them whole.
pub(super) fn push_escaped(out: &mut impl Write, text: &str) {
    // Writing to a string cannot fail.
    let mut rest = text;
    while let Some(at) = rest.bytes().position(reserved) {
        let _ = out.write_str(&rest[..at]);
        let _ = write!(out, "%{:02X}", rest.as_bytes()[at]);
        // A reserved byte is a whole (ASCII) character: `at + 1` is a
        // character boundary.
        rest = &rest[at + 1..];
    }
    let _ = out.write_str(rest);
}

/// `rls:<domain>`, the start of every namespace of the domain.
pub(super) fn domain_namespace(domain: &str) -> String {
    let mut out = String::from(NAMESPACE_PREFIX);
    push_escaped(&mut out, domain);
    out
}

/// Appends one level of a rule's path: `/<key>` or `/<key>=<value>`.
pub(super) fn push_level(namespace: &mut String, key: &str, value: &str) {
    namespace.push('/');
    push_escaped(namespace, key);
    if !value.is_empty() {
        namespace.push('=');
        push_escaped(namespace, value);
    }
}

/// `rls:<domain>#<unit>`: where request overrides of this unit count.
pub(crate) fn override_namespace(domain: &str, unit: Unit) -> String {
    let mut out = domain_namespace(domain);
    out.push('#');
    out.push_str(unit.as_str());
    out
}

/// What a long key is stored as: `sha256:` and the lowercase hex SHA-256 of
/// the key, 71 bytes. A descriptor key always holds a `=`, which this has
/// not, so a digest never meets a key kept as written.
pub(super) fn digest_key(key: &str) -> String {
    use ring::digest::{SHA256, digest};
    let hash = digest(&SHA256, key.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in hash.as_ref() {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The key of a descriptor: `<key>=<value>` per entry, joined by `|`.
pub(super) fn descriptor_key<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> CompactString {
    // Up to 24 bytes inline; longer, one allocation when nothing needs
    // escaping.
    let size = entries
        .clone()
        .into_iter()
        .map(|(k, v)| k.len() + v.len() + 2)
        .sum();
    let mut out = CompactString::with_capacity(size);
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        push_escaped(&mut out, key);
        out.push('=');
        push_escaped(&mut out, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn namespaces_read_as_the_path_to_the_rule() {
        let mut ns = domain_namespace("messaging");
        push_level(&mut ns, "message_type", "marketing");
        push_level(&mut ns, "to_number", "");
        assert_eq!(ns, "rls:messaging/message_type=marketing/to_number");
        let mut ns = domain_namespace("files");
        push_level(&mut ns, "path", "/api/*");
        assert_eq!(ns, "rls:files/path=%2Fapi%2F*");
        assert_eq!(override_namespace("edge", Unit::Minute), "rls:edge#minute");
    }

    #[test]
    fn reserved_characters_are_encoded_so_paths_read_back_one_way() {
        // Without encoding these would all read "rls:a/b=c/d".
        let mut one = domain_namespace("a/b=c");
        push_level(&mut one, "d", "");
        let mut two = domain_namespace("a");
        push_level(&mut two, "b", "c/d");
        let mut three = domain_namespace("a");
        push_level(&mut three, "b=c", "");
        push_level(&mut three, "d", "");
        assert_eq!(one, "rls:a%2Fb%3Dc/d");
        assert_eq!(two, "rls:a/b=c%2Fd");
        assert_eq!(three, "rls:a/b%3Dc/d");
        // A domain holding '#' cannot pose as another domain's override.
        assert_ne!(
            domain_namespace("edge#minute"),
            override_namespace("edge", Unit::Minute)
        );
        let mut braces = String::new();
        push_escaped(&mut braces, "{tag} 100%|\n");
        assert_eq!(braces, "%7Btag%7D%20100%25%7C%0A");
        // Multi-byte characters pass whole, next to and between reserved
        // ones; DEL is a control character.
        let mut mixed = String::new();
        push_escaped(&mut mixed, "é/日本=\u{7f}ü|");
        assert_eq!(mixed, "é%2F日本%3D%7Fü%7C");
    }

    /// Escaping one character at a time: what [`push_escaped`] must equal.
    fn escaped_by_char(text: &str) -> String {
        let mut out = String::new();
        for c in text.chars() {
            if matches!(c, '%' | '/' | '=' | '|' | '#' | '{' | '}' | ' ') || c.is_ascii_control() {
                out.push_str(&format!("%{:02X}", u32::from(c)));
            } else {
                out.push(c);
            }
        }
        out
    }

    proptest! {
        #[test]
        fn escaping_by_runs_equals_escaping_by_character(text in any::<String>(), reserved in text()) {
            for text in [text.as_str(), reserved.as_str()] {
                let mut out = String::new();
                push_escaped(&mut out, text);
                prop_assert_eq!(out, escaped_by_char(text));
            }
        }
    }

    /// Strings over an alphabet rich in the reserved characters.
    fn text() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[ab/=|#%{}* \\x00]{0,4}").expect("a valid regex")
    }

    fn path() -> impl Strategy<Value = (String, Vec<(String, String)>)> {
        (text(), proptest::collection::vec((text(), text()), 0..3))
    }

    fn namespace((domain, levels): &(String, Vec<(String, String)>)) -> String {
        let mut ns = domain_namespace(domain);
        for (key, value) in levels {
            push_level(&mut ns, key, value);
        }
        ns
    }

    proptest! {
        #[test]
        fn different_paths_never_share_a_namespace(a in path(), b in path()) {
            prop_assert_eq!(namespace(&a) == namespace(&b), a == b);
        }

        #[test]
        fn different_descriptors_never_share_a_key(
            a in proptest::collection::vec((text(), text()), 1..3),
            b in proptest::collection::vec((text(), text()), 1..3),
        ) {
            let key = |d: &Vec<(String, String)>| descriptor_key(d.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            prop_assert_eq!(key(&a) == key(&b), a == b);
        }

        #[test]
        fn no_override_namespace_is_a_rule_namespace(a in path(), domain in text()) {
            for unit in Unit::ALL {
                prop_assert_ne!(namespace(&a), override_namespace(&domain, unit));
            }
        }
    }

    #[test]
    fn digests_are_sha256_and_never_a_descriptor_key() {
        assert_eq!(
            digest_key("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(digest_key(&"x".repeat(10_000)).len(), 71);
        assert!(!digest_key("path=/a").contains('='));
    }

    #[test]
    fn descriptor_keys_list_every_entry() {
        let key = descriptor_key([("remote_address", "10.0.0.1"), ("path", "/a|b")]);
        assert_eq!(key, "remote_address=10.0.0.1|path=%2Fa%7Cb");
        // A value holding the separators cannot fake a second entry.
        assert_ne!(
            descriptor_key([("a", "1|b=2")]),
            descriptor_key([("a", "1"), ("b", "2")])
        );
        assert_eq!(descriptor_key([("k", "")]), "k=");
    }
}
