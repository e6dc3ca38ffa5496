//! The YAML layer: one file to one document of nodes that know their line
//! and column, and typed reads of its scalars that read them as
//! envoyproxy/ratelimit's YAML library (go-yaml v2, YAML 1.1) does.
//!
//! saphyr loads the document with scalars kept as written (its loader with
//! early parsing off), so a `value: 010` stays the string `010` and a
//! `requests_per_unit` is parsed here, by the rules of the field it is in.
//! saphyr also refuses duplicate keys in a mapping (as go-yaml v2 does).
//!
//! A rules file is read whole into memory and walked recursively, so its
//! events pass a [`Guard`] before they reach the loader: nesting deeper
//! than [`MAX_DEPTH`], more than [`MAX_NODES`] nodes, and anchors and
//! aliases that would copy past [`MAX_ALIAS_NODES`] nodes or
//! [`MAX_ALIAS_BYTES`] bytes of text and tags (a "billion laughs", in
//! values, keys or tags) are refused at the line that does it, before
//! anything is built.

use std::collections::HashMap;
use std::path::Path;

use saphyr::{MarkedYaml, Marker, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::{Event, Parser, SpannedEventReceiver};

use super::RlsConfigError;

/// A node of a loaded file.
pub(super) type Node<'i> = MarkedYaml<'i>;

/// The file being read, for errors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ctx<'a> {
    pub(super) file: &'a Path,
}

impl Ctx<'_> {
    /// An error about the field at `path`, located at `node`.
    pub(super) fn error(
        &self,
        path: &str,
        node: &Node<'_>,
        message: impl Into<String>,
    ) -> RlsConfigError {
        self.error_at(path, node.span.start, message)
    }

    /// An error about the field at `path`, located at `mark`.
    pub(super) fn error_at(
        &self,
        path: &str,
        mark: Marker,
        message: impl Into<String>,
    ) -> RlsConfigError {
        RlsConfigError::new(self.file, path, message).at(mark.line(), mark.col() + 1)
    }
}

/// The deepest nesting of lists and mappings a rules file may have. The
/// reference's deepest useful file nests a descriptor tree a few levels;
/// 64 leaves room and keeps the recursive walks far from the stack's end.
pub(super) const MAX_DEPTH: usize = 64;

/// How many nodes a file may load into, aliases expanded: about 45,000
/// descriptors, and about 230 MB while the file is loaded.
pub(super) const MAX_NODES: usize = 500_000;

/// How many nodes anchors and aliases may copy in a file, in all.
pub(super) const MAX_ALIAS_NODES: usize = 100_000;

/// How many bytes of text (scalars and tags) anchors and aliases may copy
/// in a file, in all.
pub(super) const MAX_ALIAS_BYTES: usize = 16 << 20;

/// Parses `text` into its one document; `None` for an empty file.
///
/// # Errors
///
/// Malformed YAML, a duplicate key, a second document in the file, and
/// what the [`Guard`] refuses.
pub(super) fn parse<'i>(ctx: Ctx<'_>, text: &'i str) -> Result<Option<Node<'i>>, RlsConfigError> {
    let scan_error = |e: &saphyr::ScanError| {
        ctx.error_at("", *e.marker(), format!("invalid YAML: {}", e.info()))
    };
    let mut loader = YamlLoader::<Node<'i>>::default();
    loader.early_parse(false);
    loader.alias_limit(MAX_ALIAS_NODES);
    let mut guard = Guard::default();
    let mut parser = Parser::new_from_str(text);
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| scan_error(&e))?;
        guard
            .check(&event)
            .map_err(|message| ctx.error_at("", span.start, message))?;
        let end = event == Event::StreamEnd;
        loader.on_event(event, span);
        if end {
            break;
        }
    }
    if let Some(e) = loader.error() {
        return Err(scan_error(e));
    }
    let mut docs = loader.into_documents().into_iter();
    let first = docs.next();
    if let Some(second) = docs.next() {
        return Err(ctx.error(
            "",
            &second,
            "a second YAML document; a file holds one domain (start another file)",
        ));
    }
    Ok(first.filter(|doc| !is_null(doc)))
}

/// What a node amounts to once its aliases are expanded.
#[derive(Clone, Copy, Debug, Default)]
struct Size {
    nodes: usize,
    bytes: usize,
}

impl Size {
    fn add(&mut self, other: Size) {
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// A list or mapping being read: its anchor (0 for none) and its size so
/// far.
#[derive(Debug)]
struct Open {
    anchor: usize,
    size: Size,
}

/// Reads a file's events ahead of the loader and refuses what would make
/// loading or walking it costly: see the module's documentation.
#[derive(Debug, Default)]
struct Guard {
    open: Vec<Open>,
    /// Each anchor's expanded size.
    anchors: HashMap<usize, Size>,
    /// What the loaded document holds, copies included.
    loaded: Size,
    /// What copies add: each alias, and each anchor (the loader keeps a
    /// copy of every anchored node to resolve its aliases).
    copied: Size,
}

impl Guard {
    fn check(&mut self, event: &Event<'_>) -> Result<(), String> {
        match event {
            Event::Scalar(text, _, anchor, tag) => {
                let size = Size {
                    nodes: 1,
                    bytes: text.len() + tag_bytes(tag.as_deref()),
                };
                self.add(size)?;
                if *anchor != 0 {
                    self.anchors.insert(*anchor, size);
                    self.copy(size)?;
                }
            }
            Event::Alias(id) => {
                let size = self.anchors.get(id).copied().unwrap_or_default();
                self.add(size)?;
                self.copy(size)?;
            }
            Event::SequenceStart(anchor, tag) | Event::MappingStart(anchor, tag) => {
                if self.open.len() == MAX_DEPTH {
                    return Err(format!(
                        "lists and mappings nest deeper than {MAX_DEPTH} levels"
                    ));
                }
                let size = Size {
                    nodes: 1,
                    bytes: tag_bytes(tag.as_deref()),
                };
                self.count(size)?;
                self.open.push(Open {
                    anchor: *anchor,
                    size,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(done) = self.open.pop() {
                    if done.anchor != 0 {
                        self.anchors.insert(done.anchor, done.size);
                        self.copy(done.size)?;
                    }
                    if let Some(parent) = self.open.last_mut() {
                        parent.size.add(done.size);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts a node (or what an alias expands to) in the collection it is
    /// in and in the document.
    fn add(&mut self, size: Size) -> Result<(), String> {
        if let Some(parent) = self.open.last_mut() {
            parent.size.add(size);
        }
        self.count(size)
    }

    /// Counts `size` in the document.
    fn count(&mut self, size: Size) -> Result<(), String> {
        self.loaded.add(size);
        if self.loaded.nodes > MAX_NODES {
            return Err(format!(
                "more than {MAX_NODES} YAML nodes (aliases expanded); split the rules over several files"
            ));
        }
        Ok(())
    }

    /// Counts a copy the loader makes.
    fn copy(&mut self, size: Size) -> Result<(), String> {
        self.copied.add(size);
        if self.copied.nodes > MAX_ALIAS_NODES || self.copied.bytes > MAX_ALIAS_BYTES {
            return Err(format!(
                "anchors and aliases copy past {MAX_ALIAS_NODES} nodes or {} MiB of text; \
                 write the repeated part out, or split the file",
                MAX_ALIAS_BYTES >> 20
            ));
        }
        Ok(())
    }
}

/// The bytes a tag keeps with each copy of its node.
fn tag_bytes(tag: Option<&saphyr_parser::Tag>) -> usize {
    tag.map_or(0, |t| t.handle.len() + t.suffix.len())
}

/// The node, with a tag on a collection looked through.
fn untagged<'n, 'i>(node: &'n Node<'i>) -> &'n Node<'i> {
    match &node.data {
        YamlData::Tagged(_, inner) => untagged(inner),
        _ => node,
    }
}

/// A scalar as written: its text, and whether it is plain (unquoted and not
/// tagged `!!str`), which is when YAML gives it a type of its own.
fn scalar<'n>(node: &'n Node<'_>) -> Option<(&'n str, bool)> {
    match &untagged(node).data {
        YamlData::Representation(text, style, tag) => {
            let forced_string = tag
                .as_ref()
                .is_some_and(|t| t.is_yaml_core_schema() && t.suffix == "str");
            Some((text, *style == ScalarStyle::Plain && !forced_string))
        }
        _ => None,
    }
}

/// Whether the node is YAML's null: nothing, `~` or `null` (go-yaml reads
/// these as an absent field).
pub(super) fn is_null(node: &Node<'_>) -> bool {
    match &untagged(node).data {
        YamlData::BadValue => true,
        _ => {
            matches!(scalar(node), Some((text, true)) if matches!(text, "" | "~" | "null" | "Null" | "NULL"))
        }
    }
}

/// What the node is, for messages.
pub(super) fn kind(node: &Node<'_>) -> &'static str {
    match &untagged(node).data {
        YamlData::Mapping(_) => "a mapping",
        YamlData::Sequence(_) => "a list",
        _ if is_null(node) => "null",
        _ => "a scalar",
    }
}

/// The entries of a mapping, in file order; empty for null.
///
/// YAML 1.1 merge keys are followed, as go-yaml v2 follows them: a
/// `<<: *anchor` (or a list of them) adds the entries of the mappings it
/// names that the mapping does not set itself, the first named winning.
///
/// # Errors
///
/// Anything else than a mapping or null, and a merge of anything else than
/// mappings.
pub(super) fn mapping<'n, 'i>(
    ctx: Ctx<'_>,
    path: &str,
    node: &'n Node<'i>,
) -> Result<Vec<(&'n Node<'i>, &'n Node<'i>)>, RlsConfigError> {
    let map = match &untagged(node).data {
        YamlData::Mapping(map) => map,
        _ if is_null(node) => return Ok(Vec::new()),
        _ => {
            return Err(ctx.error(path, node, format!("must be a mapping, not {}", kind(node))));
        }
    };
    let (merges, mut entries): (Vec<_>, Vec<_>) = map
        .iter()
        .partition(|(k, _)| matches!(scalar(k), Some(("<<", true))));
    for (_, merged) in merges {
        let sources = match &untagged(merged).data {
            YamlData::Sequence(items) => items.iter().collect(),
            _ => vec![merged],
        };
        for source in sources {
            if !matches!(untagged(source).data, YamlData::Mapping(_)) {
                return Err(ctx.error(
                    path,
                    source,
                    format!("<< merges mappings, not {}", kind(source)),
                ));
            }
            for (k, v) in mapping(ctx, path, source)? {
                let text = scalar(k).map(|(t, _)| t);
                if text.is_none()
                    || !entries
                        .iter()
                        .any(|(e, _)| scalar(e).map(|(t, _)| t) == text)
                {
                    entries.push((k, v));
                }
            }
        }
    }
    Ok(entries)
}

/// The items of a list; empty for null.
///
/// # Errors
///
/// Anything else than a list or null.
pub(super) fn sequence<'n, 'i>(
    ctx: Ctx<'_>,
    path: &str,
    node: &'n Node<'i>,
) -> Result<&'n [Node<'i>], RlsConfigError> {
    match &untagged(node).data {
        YamlData::Sequence(items) => Ok(items),
        _ if is_null(node) => Ok(&[]),
        _ => Err(ctx.error(path, node, format!("must be a list, not {}", kind(node)))),
    }
}

/// A mapping key, which must be a scalar.
///
/// # Errors
///
/// A list or mapping used as a key.
pub(super) fn key<'n>(
    ctx: Ctx<'_>,
    path: &str,
    node: &'n Node<'_>,
) -> Result<&'n str, RlsConfigError> {
    scalar(node).map(|(text, _)| text).ok_or_else(|| {
        ctx.error(
            path,
            node,
            format!("a key must be a string, not {}", kind(node)),
        )
    })
}

/// A string field: any scalar as written (go-yaml puts a number's text in a
/// string field too); null is the empty string.
///
/// # Errors
///
/// A list or a mapping.
pub(super) fn string(ctx: Ctx<'_>, path: &str, node: &Node<'_>) -> Result<String, RlsConfigError> {
    if is_null(node) {
        return Ok(String::new());
    }
    scalar(node)
        .map(|(text, _)| text.to_owned())
        .ok_or_else(|| ctx.error(path, node, format!("must be a string, not {}", kind(node))))
}

/// A boolean field, with YAML 1.1's spellings (`true`, `yes`, `on`, `y`
/// and their negations, in lower, title or upper case) as go-yaml v2
/// accepts them; null is false.
///
/// # Errors
///
/// Anything else, a quoted `"true"` included.
pub(super) fn boolean(ctx: Ctx<'_>, path: &str, node: &Node<'_>) -> Result<bool, RlsConfigError> {
    if is_null(node) {
        return Ok(false);
    }
    let parsed = match scalar(node) {
        Some((text, true)) => yaml11_bool(text),
        _ => None,
    };
    parsed.ok_or_else(|| ctx.error(path, node, "must be true or false"))
}

fn yaml11_bool(text: &str) -> Option<bool> {
    const TRUE: [&str; 5] = ["true", "yes", "on", "y", "Y"];
    const FALSE: [&str; 5] = ["false", "no", "off", "n", "N"];
    let spelled = |words: [&str; 5]| {
        words.iter().any(|w| {
            *w == text || (w.len() > 1 && (text == w.to_uppercase() || text == title_case(w)))
        })
    };
    if spelled(TRUE) {
        Some(true)
    } else if spelled(FALSE) {
        Some(false)
    } else {
        None
    }
}

fn title_case(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// An unsigned integer field of at most `max`: decimal (with `_`
/// separators), or `0x`, `0o`, `0b` prefixed; null is 0.
///
/// A decimal with a leading zero (`010`) is refused: YAML 1.1, and so the
/// reference, reads it as octal (8), which is rarely what was meant.
///
/// # Errors
///
/// Anything else, negative numbers and numbers above `max` included.
pub(super) fn unsigned(
    ctx: Ctx<'_>,
    path: &str,
    node: &Node<'_>,
    max: u64,
) -> Result<u64, RlsConfigError> {
    if is_null(node) {
        return Ok(0);
    }
    let range = || format!("must be a whole number from 0 to {max}");
    let Some((text, true)) = scalar(node) else {
        return Err(ctx.error(path, node, range()));
    };
    let digits = text.strip_prefix('+').unwrap_or(text).replace('_', "");
    let (radix, digits) = match digits.get(..2) {
        Some("0x") => (16, &digits[2..]),
        Some("0o") => (8, &digits[2..]),
        Some("0b") => (2, &digits[2..]),
        _ if digits.len() > 1 && digits.starts_with('0') => {
            return Err(ctx.error(
                path,
                node,
                format!("{text} has a leading zero, which YAML 1.1 reads as octal; write it without the zero (or as 0o{})", &digits[1..]),
            ));
        }
        _ => (10, digits.as_str()),
    };
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|n| *n <= max && !digits.starts_with('+'))
        .ok_or_else(|| ctx.error(path, node, format!("{} (got {text})", range())))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn with_doc<T>(text: &str, f: impl FnOnce(Ctx<'_>, &Node<'_>) -> T) -> T {
        let file = PathBuf::from("t.yaml");
        let ctx = Ctx { file: &file };
        let doc = parse(ctx, text).expect("valid YAML").expect("a document");
        f(ctx, &doc)
    }

    fn field<T>(
        text: &str,
        read: impl Fn(Ctx<'_>, &Node<'_>) -> Result<T, RlsConfigError>,
    ) -> Result<T, String> {
        with_doc(text, |ctx, doc| {
            let entries = mapping(ctx, "", doc).expect("a mapping");
            read(ctx, entries[0].1).map_err(|e| e.to_string())
        })
    }

    #[test]
    fn strings_keep_scalars_as_written() {
        let s = |text: &str| field(text, |c, n| string(c, "f", n));
        assert_eq!(s("f: 010"), Ok("010".to_owned()));
        assert_eq!(s("f: 1.50"), Ok("1.50".to_owned()));
        assert_eq!(s("f: yes"), Ok("yes".to_owned()));
        assert_eq!(s("f: \"a b\""), Ok("a b".to_owned()));
        assert_eq!(s("f:"), Ok(String::new()));
        assert_eq!(s("f: ~"), Ok(String::new()));
        assert_eq!(s("f: 'null'"), Ok("null".to_owned()));
        assert_eq!(
            s("f: [a]"),
            Err("t.yaml: f: must be a string, not a list (line 1, column 4)".to_owned())
        );
    }

    #[test]
    fn booleans_accept_yaml_1_1_spellings_only_unquoted() {
        let b = |text: &str| field(text, |c, n| boolean(c, "f", n));
        for yes in ["true", "True", "TRUE", "yes", "Yes", "on", "ON", "y", "Y"] {
            assert_eq!(b(&format!("f: {yes}")), Ok(true), "{yes}");
        }
        for no in ["false", "False", "no", "NO", "off", "n", "N", ""] {
            assert_eq!(b(&format!("f: {no}")), Ok(false), "{no}");
        }
        for bad in ["'true'", "\"yes\"", "1", "tRUE", "{}"] {
            assert!(b(&format!("f: {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn unsigned_integers_in_range_and_refuses_the_rest() {
        let u = |text: &str| field(text, |c, n| unsigned(c, "f", n, u64::from(u32::MAX)));
        assert_eq!(u("f: 0"), Ok(0));
        assert_eq!(u("f:"), Ok(0));
        assert_eq!(u("f: 4294967295"), Ok(4_294_967_295));
        assert_eq!(u("f: 1_000"), Ok(1000));
        assert_eq!(u("f: +7"), Ok(7));
        assert_eq!(u("f: 0x1F"), Ok(31));
        assert_eq!(u("f: 0o17"), Ok(15));
        assert_eq!(u("f: 0b101"), Ok(5));
        for bad in ["4294967296", "-1", "1.5", "'10'", "ten", "++1", "0x", "[1]"] {
            assert!(u(&format!("f: {bad}")).is_err(), "{bad}");
        }
        assert_eq!(
            u("f: 010"),
            Err("t.yaml: f: 010 has a leading zero, which YAML 1.1 reads as octal; write it without the zero (or as 0o10) (line 1, column 4)".to_owned())
        );
    }

    #[test]
    fn refuses_duplicate_keys_bad_yaml_and_second_documents() {
        let file = PathBuf::from("t.yaml");
        let ctx = Ctx { file: &file };
        let err = |text| parse(ctx, text).expect_err("refused").to_string();
        assert!(
            err("a: 1\na: 2\n").contains("duplicated key"),
            "{}",
            err("a: 1\na: 2\n")
        );
        assert!(err("a: [1\n").starts_with("t.yaml: invalid YAML: "));
        assert_eq!(
            err("domain: a\n---\ndomain: b\n"),
            "t.yaml: a second YAML document; a file holds one domain (start another file) (line 3, column 1)"
        );
    }

    #[test]
    fn an_empty_file_has_no_document() {
        let file = PathBuf::from("t.yaml");
        let ctx = Ctx { file: &file };
        assert!(parse(ctx, "").expect("valid").is_none());
        assert!(parse(ctx, "# only a comment\n").expect("valid").is_none());
    }

    #[test]
    fn aliases_are_expanded() {
        let s = field("f: &x hello\ng: *x\n", |c, n| string(c, "f", n));
        assert_eq!(s, Ok("hello".to_owned()));
        with_doc("a: &x hello\nb: *x\n", |ctx, doc| {
            let entries = mapping(ctx, "", doc).expect("a mapping");
            assert_eq!(string(ctx, "b", entries[1].1), Ok("hello".to_owned()));
        });
    }

    fn refused(text: &str) -> String {
        let file = PathBuf::from("t.yaml");
        parse(Ctx { file: &file }, text)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn refuses_alias_bombs_by_nodes_and_by_bytes() {
        // Nine levels of ten: a billion nodes from a few hundred bytes.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..9 {
            let prev = format!("*a{}", level - 1);
            bomb.push_str(&format!(
                "a{level}: &a{level} [{}]\n",
                vec![prev; 10].join(", ")
            ));
        }
        let err = refused(&bomb);
        assert!(err.contains("copy past 100000 nodes"), "{err}");
        // Few nodes, but each a megabyte of text.
        let long = format!(
            "a: &big {}\nb: [{}]\n",
            "x".repeat(1 << 20),
            vec!["*big"; 17].join(", ")
        );
        let err = refused(&long);
        assert!(err.contains("16 MiB of text"), "{err}");
        // Sixteen copies of the megabyte still load.
        let fine = format!(
            "a: &big {}\nb: [{}]\n",
            "x".repeat(1 << 20),
            vec!["*big"; 15].join(", ")
        );
        let file = PathBuf::from("t.yaml");
        assert!(parse(Ctx { file: &file }, &fine).is_ok());
    }

    #[test]
    fn counts_what_aliases_put_in_keys_too() {
        // saphyr's own budget counts a mapping's key as one node, whatever
        // it holds: ten copies a level inside keys would pass it.
        let mut bomb = String::from("k0: &k0 {? [x, x, x, x, x, x, x, x, x, x] : 1}\n");
        for level in 1..9 {
            let prev = format!("*k{}", level - 1);
            bomb.push_str(&format!(
                "k{level}: &k{level} {{? [{}] : 1}}\n",
                vec![prev; 10].join(", ")
            ));
        }
        let err = refused(&bomb);
        assert!(err.contains("copy past 100000 nodes"), "{err}");
    }

    #[test]
    fn refuses_deep_nesting_in_block_and_flow_style() {
        let flow = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let err = refused(&flow);
        assert!(err.contains("nest deeper than 64 levels"), "{err}");
        // The scanner has a flow limit of its own, which holds first.
        let flow = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(refused(&flow).contains("invalid YAML: recursion limit exceeded"));
        let mut block = String::new();
        for depth in 0..200 {
            block.push_str(&format!("{}k{depth}:\n", " ".repeat(depth)));
        }
        let err = refused(&block);
        assert!(err.contains("nest deeper than 64 levels"), "{err}");
        assert!(err.contains("(line 65, column"), "{err}");
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let file = PathBuf::from("t.yaml");
        assert!(parse(Ctx { file: &file }, &ok).is_ok());
    }

    #[test]
    fn anchors_within_anchors_count_their_expansion() {
        // b holds two copies of a, c four: 1 + 2 + 4 copies of 5 MiB
        // would pass a budget that counted only aliases' own nodes.
        let text = format!(
            "a: &a {}\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c]\n",
            "x".repeat(5 << 20)
        );
        assert!(refused(&text).contains("16 MiB of text"));
    }

    #[test]
    fn counts_the_tags_copies_keep() {
        // A megabyte tag on a short scalar, aliased 17 times.
        let text = format!(
            "x: &a !<{}> v\ny: [{}]\n",
            "t".repeat(1 << 20),
            vec!["*a"; 17].join(", ")
        );
        assert!(refused(&text).contains("16 MiB of text"));
    }

    #[test]
    fn counts_the_copy_the_loader_keeps_of_each_anchor() {
        // No alias at all: each of the nested anchors is a copy of the list.
        let mut text = String::new();
        for level in 0..20 {
            text.push_str(&format!("{}- &a{level}\n", "  ".repeat(level)));
        }
        text.push_str(&format!(
            "{}- [{}]\n",
            "  ".repeat(20),
            vec!["x"; 10_000].join(", ")
        ));
        let err = refused(&text);
        assert!(err.contains("copy past 100000 nodes"), "{err}");
    }

    #[test]
    fn refuses_more_nodes_than_the_most() {
        let at_most = format!("[{}]\n", vec!["x"; MAX_NODES - 1].join(","));
        let file = PathBuf::from("t.yaml");
        assert!(parse(Ctx { file: &file }, &at_most).is_ok());
        let over = format!("[{}]\n", vec!["x"; MAX_NODES].join(","));
        assert!(refused(&over).contains("more than 500000 YAML nodes"));
    }

    #[test]
    fn merge_keys_add_what_a_mapping_does_not_set_itself() {
        let text = "base: &b {unit: second, requests_per_unit: 5}\nother: &o {name: x, unit: hour}\nm:\n  <<: [*b, *o]\n  requests_per_unit: 7\n";
        with_doc(text, |ctx, doc| {
            let top = mapping(ctx, "", doc).expect("a mapping");
            let m = mapping(ctx, "m", top[2].1).expect("merged");
            let fields: Vec<(String, String)> = m
                .iter()
                .map(|(k, v)| {
                    (
                        string(ctx, "", k).expect("key"),
                        string(ctx, "", v).expect("value"),
                    )
                })
                .collect();
            let get = |f: &str| fields.iter().find(|(k, _)| k == f).map(|(_, v)| v.as_str());
            assert_eq!(
                get("requests_per_unit"),
                Some("7"),
                "the mapping's own wins"
            );
            assert_eq!(get("unit"), Some("second"), "the first merged wins");
            assert_eq!(get("name"), Some("x"));
            assert_eq!(fields.len(), 3);
        });
        let err = field("m: {<<: 5}\n", |c, n| mapping(c, "m", n).map(|_| ()));
        assert!(
            err.expect_err("not a mapping")
                .contains("<< merges mappings, not a scalar")
        );
    }
}
