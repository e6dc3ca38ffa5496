//! Settings given as flags or environment variables: one flag and one
//! variable per declared setting, generated from the declarations in
//! [`super::settings`]. Each one set replaces the file's value.

use clap::{Arg, ArgAction, ArgMatches, Command, FromArgMatches, parser::ValueSource};

use super::settings::{self, Kind, Setting};

/// The settings given on the command line or in the environment, as text,
/// by setting path. Their values are checked with the rest of the
/// configuration, and an invalid one is reported as coming from a flag or
/// environment variable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlagValues {
    values: Vec<(&'static Setting, Vec<String>)>,
}

impl FlagValues {
    /// No flag or variable given.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `path` (such as `store.max_keys`) to `value`, written as on the
    /// command line (a list comma-separated).
    ///
    /// # Panics
    ///
    /// When no setting is declared at `path`: a bug in the caller.
    #[must_use]
    pub fn with(mut self, path: &str, value: &str) -> Self {
        let setting = settings::find(path)
            .filter(|s| s.kind != Kind::Table)
            .unwrap_or_else(|| panic!("no setting is declared at {path}"));
        let values = match setting.kind {
            Kind::List => value.split(',').map(str::to_owned).collect(),
            _ => vec![value.to_owned()],
        };
        self.values.retain(|(s, _)| s.path != setting.path);
        self.values.push((setting, values));
        self
    }

    /// The paths of the settings given (`store.max_keys`), in the order
    /// given.
    pub fn paths(&self) -> impl Iterator<Item = &'static str> {
        self.values.iter().map(|(s, _)| s.path)
    }

    /// The settings given, with their values as text.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static Setting, &[String])> {
        self.values.iter().map(|(s, v)| (*s, v.as_slice()))
    }
}

fn flags() -> impl Iterator<Item = &'static Setting> {
    settings::all().filter(|s| s.kind != Kind::Table)
}

impl clap::Args for FlagValues {
    fn augment_args(mut cmd: Command) -> Command {
        for setting in flags() {
            let mut help = setting.help();
            if let Some(default) = setting.default {
                help.push_str(&format!(" [default: {default}]"));
            }
            let mut arg = Arg::new(setting.path)
                .long(setting.flag())
                .env(setting.env())
                .value_name(
                    setting
                        .path
                        .rsplit('.')
                        .next()
                        .unwrap_or(setting.path)
                        .to_ascii_uppercase(),
                )
                .help(help)
                .action(ArgAction::Set);
            if setting.kind == Kind::List {
                arg = arg.value_delimiter(',').action(ArgAction::Append);
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for FlagValues {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = FlagValues::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for setting in flags() {
            let given = matches!(
                matches.value_source(setting.path),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            if !given {
                continue;
            }
            let values: Vec<String> = matches
                .get_many::<String>(setting.path)
                .map(|v| v.cloned().collect())
                .unwrap_or_default();
            self.values.retain(|(s, _)| s.path != setting.path);
            self.values.push((setting, values));
        }
        Ok(())
    }
}
