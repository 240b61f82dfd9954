//! Serves the receiver on 127.0.0.1:3001 with `./webhooks.db` and the
//! secret `demo-secret`. A delivery is signed as Standard Webhooks signs
//! it: `webhook-signature: v1,<base64 HMAC-SHA256 of {id}.{timestamp}.{body}>`
//! ([`example_webhook_receiver::sign`]).
use std::path::Path;
use std::sync::Arc;

use axum_idempotency::SqliteStore;
use axum_idempotency::clock::SystemClock;
use example_webhook_receiver::{Sender, app};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open(Path::new("webhooks.db")).await?;
    let sender = Sender {
        name: "billing".into(),
        secret: b"demo-secret".to_vec(),
    };
    let app = app(store, Arc::new(SystemClock), sender).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
