//! AWS shared config files, read as the AWS CLI and SDKs read them (issue 44): the profile named
//! by `AWS_PROFILE` (else `default`) in the credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//! `~/.aws/credentials`, section `[NAME]`) and the config file (`AWS_CONFIG_FILE`, else
//! `~/.aws/config`, section `[profile NAME]`, or `[default]`). A key in the credentials file wins
//! over the same key in the config file.
//!
//! object_store reads none of this (its `AmazonS3Builder::from_env` takes `AWS_*` variables only),
//! so the profile is applied to the builder here, below what the environment already set:
//! `aws_access_key_id` + `aws_secret_access_key` (+ `aws_session_token`) when the environment has
//! no static keys, `region` when neither `AWS_REGION` nor `AWS_DEFAULT_REGION` is set,
//! `endpoint_url` when `AWS_ENDPOINT_URL` is not (an `http://` one allows plain HTTP, as it does
//! for the AWS CLI). That is the AWS SDKs' order: environment keys, then the profile, then web
//! identity, containers and the instance metadata service.
//!
//! A profile that gets its credentials another way — `credential_process`, `role_arn` (with
//! `source_profile`, `credential_source` or `web_identity_token_file`), IAM Identity Center
//! (`sso_session`, `sso_start_url`) — is refused at startup, naming the profile, the file and the
//! key, with what to do instead: subsink does not run processes or call STS or SSO on its own.
//!
//! Values are never logged or put in an error: messages name keys and files only. [`Profile`] has
//! no `Debug` for that reason.

use std::path::{Path, PathBuf};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// Profile keys that get credentials in a way subsink does not implement, checked in this order,
/// each with what to do instead.
const UNSUPPORTED: [(&str, &str); 6] = [
    ("credential_process", EXPORT),
    ("sso_session", EXPORT),
    ("sso_start_url", EXPORT),
    ("credential_source", EXPORT),
    (
        "web_identity_token_file",
        "set AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE in the environment instead (subsink \
         reads web identity from there)",
    ),
    ("role_arn", EXPORT),
];

const EXPORT: &str = "get the credentials outside subsink (`aws configure export-credentials \
--profile NAME --format env` prints them) and give them as AWS_ACCESS_KEY_ID, \
AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN";

/// Why the shared files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("AWS shared config file {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("AWS profile `{profile}` (AWS_PROFILE) is not in {tried}")]
    Missing { profile: String, tried: String },
    #[error("AWS profile `{profile}` in {file}: `{key}` is not supported by subsink; {instead}")]
    Unsupported {
        profile: String,
        file: String,
        key: &'static str,
        instead: String,
    },
    #[error("AWS profile `{profile}` in {file}: `{have}` without `{missing}`")]
    Incomplete {
        profile: String,
        file: String,
        have: &'static str,
        missing: &'static str,
    },
}

/// Where the shared files are and which profile to read, from the environment.
#[derive(Debug, Clone)]
pub struct SharedFiles {
    pub profile: String,
    /// `AWS_PROFILE` named the profile (a missing one is an error; a missing `default` is not).
    pub explicit: bool,
    /// The credentials file, then the config file (`None` when neither its variable nor `HOME`
    /// is set).
    pub credentials: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

impl SharedFiles {
    /// From the process environment.
    pub fn from_env() -> SharedFiles {
        SharedFiles::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// From the variables `var` gives.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> SharedFiles {
        let home = var("HOME").map(PathBuf::from);
        let file = |over: &str, name: &str| {
            var(over)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        let profile = var("AWS_PROFILE");
        SharedFiles {
            explicit: profile.is_some(),
            profile: profile.unwrap_or_else(|| "default".into()),
            credentials: file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            config: file("AWS_CONFIG_FILE", "config"),
        }
    }

    /// The files, as named in messages.
    fn names(&self) -> String {
        let name = |p: &Option<PathBuf>, var: &str| match p {
            Some(p) => p.display().to_string(),
            None => format!("no {var} file ({var} and HOME unset)"),
        };
        format!(
            "{} and {}",
            name(&self.credentials, "AWS_SHARED_CREDENTIALS_FILE"),
            name(&self.config, "AWS_CONFIG_FILE")
        )
    }
}

/// One profile's keys, each with the file it came from. Holds secrets: no `Debug`.
pub struct Profile {
    pub name: String,
    entries: Vec<(String, String, PathBuf)>,
}

impl Profile {
    fn get(&self, key: &str) -> Option<(&str, &Path)> {
        self.entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, v, f)| (v.as_str(), f.as_path()))
    }
}

/// The profile of `files`, if either file has it.
pub fn read(files: &SharedFiles) -> Result<Option<Profile>, ProfileError> {
    let mut entries: Vec<(String, String, PathBuf)> = Vec::new();
    let mut found = false;
    let config_section = if files.profile == "default" {
        vec!["default".to_string(), "profile default".to_string()]
    } else {
        vec![format!("profile {}", files.profile)]
    };
    for (path, sections) in [
        (&files.credentials, vec![files.profile.clone()]),
        (&files.config, config_section),
    ] {
        let Some(path) = path else { continue };
        let Some(ini) = load(path)? else { continue };
        for section in &sections {
            let Some(props) = ini.section(Some(section.as_str())) else {
                continue;
            };
            found = true;
            for (k, v) in props.iter() {
                // The credentials file comes first: its keys win.
                if !entries.iter().any(|(have, _, _)| have == k) {
                    entries.push((k.to_string(), v.trim().to_string(), path.clone()));
                }
            }
        }
    }
    Ok(found.then(|| Profile {
        name: files.profile.clone(),
        entries,
    }))
}

/// The INI file at `path`; `None` when there is no such file.
fn load(path: &Path) -> Result<Option<ini::Ini>, ProfileError> {
    let opt = ini::ParseOption {
        enabled_quote: false,
        enabled_escape: false,
        ..Default::default()
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ProfileError::Read {
                file: path.display().to_string(),
                reason: e.to_string(),
            })
        }
    };
    // A parse error names a line and column and what the parser expected, never the text there.
    ini::Ini::load_from_str_opt(&text, opt)
        .map(Some)
        .map_err(|e| ProfileError::Read {
            file: format!("{}:{}:{}", path.display(), e.line, e.col),
            reason: e.msg.into_owned(),
        })
}

/// What applying the profile did, for the credential chain's messages.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The static keys came from the profile: named for the log (never the values).
    pub keys: Option<String>,
    /// This step of the chain, as named in the "no credentials" error.
    pub tried: String,
}

/// The builder with the profile of `files` applied below what it already holds (module doc).
pub fn apply(
    b: AmazonS3Builder,
    files: &SharedFiles,
) -> Result<(AmazonS3Builder, Applied), ProfileError> {
    let mut applied = Applied {
        keys: None,
        tried: format!(
            "the AWS shared config files' profile `{}` ({})",
            files.profile,
            files.names()
        ),
    };
    let Some(p) = read(files)? else {
        if files.explicit {
            return Err(ProfileError::Missing {
                profile: files.profile.clone(),
                tried: files.names(),
            });
        }
        applied.tried.push_str(": no such profile");
        return Ok((b, applied));
    };
    let set = |b: &AmazonS3Builder, k: AmazonS3ConfigKey| {
        b.get_config_value(&k).is_some_and(|v| !v.is_empty())
    };
    let mut b = b;
    if let Some((region, _)) = p.get("region") {
        if !set(&b, AmazonS3ConfigKey::Region) && !set(&b, AmazonS3ConfigKey::DefaultRegion) {
            b = b.with_region(region);
        }
    }
    if let Some((endpoint, _)) = p.get("endpoint_url") {
        if !set(&b, AmazonS3ConfigKey::Endpoint) {
            // The endpoint the user wrote down is the one to reach, plain HTTP or not.
            if endpoint.starts_with("http://") {
                b = b.with_allow_http(true);
            }
            b = b.with_endpoint(endpoint);
        }
    }
    if set(&b, AmazonS3ConfigKey::AccessKeyId) || set(&b, AmazonS3ConfigKey::SecretAccessKey) {
        // The environment's keys come first, as in the AWS SDKs.
        applied
            .tried
            .push_str(": not used, the environment has keys");
        return Ok((b, applied));
    }
    let file_of = |f: &Path| f.display().to_string();
    for (key, instead) in UNSUPPORTED {
        if let Some((_, file)) = p.get(key) {
            return Err(ProfileError::Unsupported {
                profile: p.name.clone(),
                file: file_of(file),
                key,
                instead: instead.replace("NAME", &p.name),
            });
        }
    }
    let id = p.get("aws_access_key_id");
    let secret = p.get("aws_secret_access_key");
    match (id, secret) {
        (Some((id, file)), Some((secret, _))) => {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some((token, _)) = p.get("aws_session_token") {
                b = b.with_token(token);
            }
            let token = if p.get("aws_session_token").is_some() {
                " + aws_session_token"
            } else {
                ""
            };
            applied.keys = Some(format!(
                "static keys (aws_access_key_id{token}) of AWS profile `{}` in {}",
                p.name,
                file_of(file)
            ));
        }
        (Some((_, file)), None) | (None, Some((_, file))) => {
            let (have, missing) = if id.is_some() {
                ("aws_access_key_id", "aws_secret_access_key")
            } else {
                ("aws_secret_access_key", "aws_access_key_id")
            };
            return Err(ProfileError::Incomplete {
                profile: p.name.clone(),
                file: file_of(file),
                have,
                missing,
            });
        }
        (None, None) => applied.tried.push_str(": no keys in it"),
    }
    Ok((b, applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, profile: Option<&str>) -> SharedFiles {
        let home = dir.display().to_string();
        SharedFiles::from_vars(|k| match k {
            "HOME" => Some(home.clone()),
            "AWS_PROFILE" => profile.map(str::to_string),
            _ => None,
        })
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir.join(".aws")).unwrap();
        std::fs::write(dir.join(".aws").join(name), text).unwrap();
    }

    #[test]
    fn credentials_file_wins_and_config_adds_the_region() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "credentials",
            "[dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = s3cr3t/+x\n",
        );
        write(
            d.path(),
            "config",
            "[default]\nregion = us-east-1\n[profile dev]\nregion = eu-west-3\n\
             aws_access_key_id = IGNORED\nendpoint_url = http://127.0.0.1:9\n",
        );
        let (b, applied) = apply(AmazonS3Builder::new(), &files(d.path(), Some("dev"))).unwrap();
        let get = |k| b.get_config_value(&k).unwrap();
        assert_eq!(get(AmazonS3ConfigKey::AccessKeyId), "AKIDDEV");
        assert_eq!(get(AmazonS3ConfigKey::SecretAccessKey), "s3cr3t/+x");
        assert_eq!(get(AmazonS3ConfigKey::Region), "eu-west-3");
        assert_eq!(get(AmazonS3ConfigKey::Endpoint), "http://127.0.0.1:9");
        let allow = AmazonS3ConfigKey::Client(object_store::ClientConfigKey::AllowHttp);
        assert_eq!(get(allow), "true");
        let keys = applied.keys.unwrap();
        assert_eq!(
            keys,
            format!(
                "static keys (aws_access_key_id) of AWS profile `dev` in {}",
                d.path().join(".aws/credentials").display()
            )
        );
    }

    #[test]
    fn the_environment_wins_and_a_missing_default_is_no_error() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "config",
            "[default]\nregion = eu-west-3\ncredential_process = x\n",
        );
        let env = AmazonS3Builder::new()
            .with_access_key_id("ENV")
            .with_secret_access_key("ENVSECRET")
            .with_region("us-west-2");
        let (b, applied) = apply(env, &files(d.path(), None)).unwrap();
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::AccessKeyId).unwrap(),
            "ENV"
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Region).unwrap(),
            "us-west-2"
        );
        assert!(applied.keys.is_none());
        let empty = tempfile::tempdir().unwrap();
        let (_, applied) = apply(AmazonS3Builder::new(), &files(empty.path(), None)).unwrap();
        assert!(
            applied.tried.ends_with(": no such profile"),
            "{}",
            applied.tried
        );
    }

    #[test]
    fn refusals_name_the_profile_the_file_and_the_key_never_a_value() {
        let d = tempfile::tempdir().unwrap();
        let config = d.path().join(".aws/config").display().to_string();
        for (text, key) in [
            (
                "[profile p]\ncredential_process = /bin/get-secret --token TOPSECRET\n",
                "credential_process",
            ),
            (
                "[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = base\n",
                "role_arn",
            ),
            ("[profile p]\nsso_session = corp\n", "sso_session"),
        ] {
            write(d.path(), "config", text);
            let e = apply(AmazonS3Builder::new(), &files(d.path(), Some("p")))
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "AWS profile `p` in {config}: `{key}` is not supported by subsink; "
                )),
                "{e}"
            );
            assert!(!e.contains("TOPSECRET") && !e.contains("arn:aws"), "{e}");
        }
        write(
            d.path(),
            "config",
            "[profile p]\naws_access_key_id = AKID\n",
        );
        let e = apply(AmazonS3Builder::new(), &files(d.path(), Some("p")))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "AWS profile `p` in {config}: `aws_access_key_id` without `aws_secret_access_key`"
            )
        );
        let e = apply(AmazonS3Builder::new(), &files(d.path(), Some("nope")))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "AWS profile `nope` (AWS_PROFILE) is not in {} and {config}",
                d.path().join(".aws/credentials").display()
            )
        );
    }
}
