//! The shared store of a fleet's deep dives, reached through the S3 API (any S3 endpoint:
//! AWS, MinIO, Ceph, moto). Requests are signed with AWS Signature V4 by `rusty-s3` (presigned
//! URLs, so no request carries the secret) and sent with a blocking HTTP client (http, or
//! https verified against the system's roots): only the upload thread and the CLI call it,
//! never the daemon's loop.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use rusty_s3::{actions::ListObjectsV2, Bucket, Credentials, S3Action, UrlStyle};

use crate::config::StoreConfig;

/// How long a signed URL stays valid; each is used at once.
const SIGNED_FOR: Duration = Duration::from_secs(300);

/// One bucket of an S3 endpoint, with the keys of this deployment under `prefix`.
pub struct Store {
    bucket: Bucket,
    credentials: Credentials,
    client: reqwest::blocking::Client,
    prefix: String,
}

impl Store {
    /// The store `cfg` names; credentials from `cfg`, else `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    pub fn open(cfg: &StoreConfig) -> Result<Store> {
        let url: url::Url = cfg.endpoint.parse().with_context(|| {
            format!(
                "[store] endpoint {:?} is not a URL: write it as http(s)://HOST:PORT",
                cfg.endpoint
            )
        })?;
        let style = if cfg.virtual_hosted {
            UrlStyle::VirtualHost
        } else {
            UrlStyle::Path
        };
        let bucket = Bucket::new(url, style, cfg.bucket.clone(), cfg.region.clone())
            .with_context(|| format!("[store] endpoint {:?}", cfg.endpoint))?;
        let key = |value: &str, var: &str| {
            if value.is_empty() {
                std::env::var(var).ok()
            } else {
                Some(value.to_string())
            }
        };
        let (Some(id), Some(secret)) = (
            key(&cfg.access_key_id, "AWS_ACCESS_KEY_ID"),
            key(&cfg.secret_access_key, "AWS_SECRET_ACCESS_KEY"),
        ) else {
            bail!("the store needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or [store] access_key_id and secret_access_key)");
        };
        // https is verified against the system's roots (rustls; main installs its provider).
        let client = reqwest::blocking::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .context("building the store's HTTP client")?;
        Ok(Store {
            bucket,
            credentials: Credentials::new(id, secret),
            client,
            prefix: cfg.prefix.trim_matches('/').to_string(),
        })
    }

    /// The full key of `rel` under this deployment's prefix.
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// Writes `body` at `rel`.
    pub fn put(&self, rel: &str, body: Vec<u8>) -> Result<()> {
        let key = self.key(rel);
        let url = self
            .bucket
            .put_object(Some(&self.credentials), &key)
            .sign(SIGNED_FOR);
        self.send(self.client.put(url).body(body), &format!("writing {key}"))
            .map(drop)
    }

    /// The object at `rel`.
    pub fn get(&self, rel: &str) -> Result<Vec<u8>> {
        let key = self.key(rel);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), &key)
            .sign(SIGNED_FOR);
        self.send(self.client.get(url), &format!("reading {key}"))
    }

    /// Every key under `rel_prefix`, relative to this deployment's prefix, in key order.
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<String>> {
        let prefix = self.key(rel_prefix);
        // Keys come back whole: this deployment's prefix and its slash are cut off.
        let strip = if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        };
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut action = self.bucket.list_objects_v2(Some(&self.credentials));
            action.with_prefix(prefix.as_str());
            if let Some(t) = &token {
                action.with_continuation_token(t.as_str());
            }
            let url = action.sign(SIGNED_FOR);
            let body = self.send(self.client.get(url), &format!("listing {prefix}"))?;
            let text = String::from_utf8_lossy(&body);
            let page = ListObjectsV2::parse_response(&text)
                .with_context(|| format!("the store's listing of {prefix} is not S3's"))?;
            keys.extend(
                page.contents
                    .into_iter()
                    .map(|c| c.key[strip..].to_string()),
            );
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        keys.sort();
        Ok(keys)
    }

    fn send(&self, request: reqwest::blocking::RequestBuilder, what: &str) -> Result<Vec<u8>> {
        // Errors leave the URL out: it carries the request's signature.
        let response = request
            .send()
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("{what}: the S3 endpoint did not answer"))?;
        let status = response.status();
        let body = response
            .bytes()
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("{what}: reading the answer"))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            bail!(
                "{what}: the S3 endpoint answered {status}: {}",
                text.chars().take(300).collect::<String>()
            );
        }
        Ok(body.to_vec())
    }
}
