//! A JSON body extractor whose rejections are problem documents.
//!
//! axum's own `Json` rejects with plain-text bodies; this one maps each
//! failure to the contract's codes: wrong media type → 415
//! `unsupported_media_type`, broken JSON → 400 `malformed_body`, valid JSON
//! with wrong fields or values (unknown fields, negative or overflowing
//! numbers) → 422 `validation_failed`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use idem_spec::fingerprint::is_json_media_type;
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Extracts and deserialises a JSON body, rejecting with [`Error`].
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !is_json_media_type(&content_type) {
            return Err(Error::UnsupportedMediaType(format!(
                "send the body as application/json (got {:?})",
                if content_type.is_empty() {
                    "no Content-Type"
                } else {
                    &content_type
                }
            )));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            Error::MalformedBody(format!("the request body could not be read: {e}"))
        })?;
        parse(&bytes).map(ApiJson)
    }
}

/// Parses JSON bytes into `T` with the crate's error mapping.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Error::Validation(format!("invalid request: {e}")),
        _ => Error::MalformedBody(format!("the body is not valid JSON: {e}")),
    })
}
