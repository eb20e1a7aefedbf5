//! One S3 client helper for every S3 server of the tests (moto, SeaweedFS, the recording proxy):
//! boto3 and object_store settings keyed by the endpoint.

use std::path::{Path, PathBuf};

use super::venv_python;

/// S3 helpers through boto3, for any S3 endpoint.
#[derive(Debug, Clone)]
pub struct S3Api {
    pub endpoint: String,
}

impl S3Api {
    /// The helper for `http://127.0.0.1:port`.
    pub fn on_port(port: u16) -> S3Api {
        S3Api {
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Environment for object_store's `AmazonS3Builder::from_env` and for boto3.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "testtesttest".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".into()),
        ]
    }

    /// object_store options for an in-process `Destination::from_url_with`.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("aws_endpoint", self.endpoint.clone()),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "testtesttest".into()),
            ("aws_region", "us-east-1".into()),
            ("aws_virtual_hosted_style_request", "false".into()),
        ]
    }

    /// Run a snippet of Python with boto3 against this endpoint; returns stdout.
    pub fn python(&self, code: &str) -> String {
        venv_python(["-c", code], &self.env())
    }

    /// Create a bucket.
    pub fn create_bucket(&self, bucket: &str) {
        self.python(&format!(
            "import boto3; boto3.client('s3').create_bucket(Bucket='{bucket}')"
        ));
    }

    /// `(key, size)` of every object in a bucket, sorted by key.
    pub fn list(&self, bucket: &str) -> Vec<(String, u64)> {
        let out = self.python(&format!(
            "import boto3, json\n\
             s3 = boto3.client('s3')\n\
             keys = []\n\
             for page in s3.get_paginator('list_objects_v2').paginate(Bucket='{bucket}'):\n    keys += [[o['Key'], o['Size']] for o in page.get('Contents', [])]\n\
             print(json.dumps(sorted(keys)))"
        ));
        serde_json::from_str(out.trim()).unwrap()
    }

    /// `(key, size)` of the objects of a bucket whose keys start with `prefix`, sorted by key.
    pub fn list_under(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        self.list(bucket)
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect()
    }

    /// Download an object to `dest`; returns its Content-Type.
    pub fn download(&self, bucket: &str, key: &str, dest: &Path) -> String {
        self.python(&format!(
            "import boto3\n\
             s3 = boto3.client('s3')\n\
             r = s3.get_object(Bucket='{bucket}', Key={key:?})\n\
             open({dest:?}, 'wb').write(r['Body'].read())\n\
             print(r.get('ContentType', ''))",
            dest = dest.display().to_string()
        ))
        .trim()
        .to_string()
    }

    /// Download every object of a bucket into `dir` (one file per object, numbered in key
    /// order); returns `(key, local path, Content-Type)`, sorted by key.
    pub fn download_all(&self, bucket: &str, dir: &Path) -> Vec<(String, PathBuf, String)> {
        std::fs::create_dir_all(dir).unwrap();
        let out = self.python(&format!(
            "import boto3, json, os\n\
             s3 = boto3.client('s3')\n\
             keys = []\n\
             for page in s3.get_paginator('list_objects_v2').paginate(Bucket='{bucket}'):\n    keys += [o['Key'] for o in page.get('Contents', [])]\n\
             out = []\n\
             for i, k in enumerate(sorted(keys)):\n    r = s3.get_object(Bucket='{bucket}', Key=k)\n    p = os.path.join({dir:?}, '%06d' % i)\n    open(p, 'wb').write(r['Body'].read())\n    out.append([k, p, r.get('ContentType', '')])\n\
             print(json.dumps(out))",
            dir = dir.display().to_string()
        ));
        let v: Vec<(String, String, String)> = serde_json::from_str(out.trim()).unwrap();
        v.into_iter()
            .map(|(k, p, c)| (k, PathBuf::from(p), c))
            .collect()
    }

    /// Download every object of a bucket into `dir`; the local files, in key order.
    pub fn download_files(&self, bucket: &str, dir: &Path) -> Vec<PathBuf> {
        self.download_all(bucket, dir)
            .into_iter()
            .map(|(_, p, _)| p)
            .collect()
    }

    /// Multipart uploads still open in a bucket (none may remain after an abort).
    pub fn open_multipart_uploads(&self, bucket: &str) -> usize {
        self.python(&format!(
            "import boto3; print(len(boto3.client('s3').list_multipart_uploads(Bucket='{bucket}').get('Uploads', [])))"
        ))
        .trim()
        .parse()
        .unwrap()
    }
}
