//! The naming rules of the resources a subscription names: `projects/{project}/{collection}/{id}`
//! and its IDs, Cloud Storage buckets, BigQuery tables (docs/contract.md §1.2).

/// `projects/{project}/{collection}/{id}` with the ID rules of docs/contract.md §1.2. The project segment is
/// only checked to be non-empty and free of spaces and control characters (real project IDs are
/// stricter, but emulators accept anything).
pub(super) fn check_resource_name(name: &str, collection: &str, what: &str) -> Result<(), String> {
    let expected = format!("must be projects/{{project}}/{collection}/{{{what}}}, got {name:?}");
    let parts: Vec<&str> = name.split('/').collect();
    let [projects, project, coll, id] = parts[..] else {
        return Err(expected);
    };
    if projects != "projects" || coll != collection {
        return Err(expected);
    }
    if project.is_empty() || project.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{expected}: the project is empty or has spaces"));
    }
    check_id(id).map_err(|rule| format!("{what} ID {id:?} {rule}"))
}

/// Topic / subscription ID rules (docs/contract.md §1.2).
pub(super) fn check_id(id: &str) -> Result<(), String> {
    if !id.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("must start with a letter".into());
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.~+%".contains(*c)))
    {
        return Err(format!(
            "may contain only letters, digits and - _ . ~ + %; found {bad:?}"
        ));
    }
    if !(3..=255).contains(&id.len()) {
        return Err(format!(
            "must be 3 to 255 characters long, got {}",
            id.len()
        ));
    }
    if id.starts_with("goog") {
        return Err("must not start with \"goog\"".into());
    }
    Ok(())
}

/// Cloud Storage bucket naming rules (the common subset; a bare name, not a URL).
pub(super) fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.starts_with("gs://") {
        return Err(format!(
            "must be a bare bucket name without gs://, e.g. {:?}",
            bucket
                .trim_start_matches("gs://")
                .split('/')
                .next()
                .unwrap_or("")
        ));
    }
    if bucket.contains('/') {
        return Err(format!(
            "must be a bare bucket name without '/' (put paths in filenamePrefix), got {bucket:?}"
        ));
    }
    if let Some(bad) = bucket
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(*c)))
    {
        return Err(format!(
            "may contain only lowercase letters, digits, '-', '_' and '.'; found {bad:?}"
        ));
    }
    let max = if bucket.contains('.') { 222 } else { 63 };
    if !(3..=max).contains(&bucket.len()) {
        return Err(format!(
            "must be 3 to {max} characters long, got {}",
            bucket.len()
        ));
    }
    if bucket.split('.').any(|part| part.len() > 63) {
        return Err("each dot-separated part must be at most 63 characters".into());
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !bucket.starts_with(alnum) || !bucket.ends_with(alnum) {
        return Err(format!(
            "must start and end with a lowercase letter or digit, got {bucket:?}"
        ));
    }
    // "Bucket names cannot be represented as an IP address in dotted-decimal notation."
    let parts: Vec<&str> = bucket.split('.').collect();
    if parts.len() == 4
        && parts.iter().all(|p| {
            (1..=3).contains(&p.len())
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().is_ok_and(|n| n <= 255)
        })
    {
        return Err(format!(
            "must not be an IP address in dotted-decimal notation, got {bucket:?}"
        ));
    }
    if bucket.starts_with("goog") || bucket.contains("google") {
        return Err("must not start with \"goog\" or contain \"google\"".into());
    }
    Ok(())
}

/// `{project}.{dataset}.{table}` or `{project}:{dataset}.{table}` (loose: three non-empty parts).
pub(super) fn check_table(table: &str) -> Result<(), String> {
    let parts: Vec<&str> = table.split(['.', ':']).collect();
    if parts.len() < 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "must be {{project}}.{{dataset}}.{{table}}, got {table:?}"
        ));
    }
    Ok(())
}
