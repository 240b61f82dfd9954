//! Serves the receiver on 127.0.0.1:3001 with `./webhooks.db` for two
//! senders, `billing` and `shop`, whose Standard Webhooks secrets are
//! `BILLING_WEBHOOK_SECRET` and `SHOP_WEBHOOK_SECRET` (`whsec_...`; demo
//! values [`DEMO_BILLING`] and [`DEMO_SHOP`] when unset). A delivery is
//! signed as Standard Webhooks signs it: `webhook-signature: v1,<base64
//! HMAC-SHA256 of {id}.{timestamp}.{body}>` ([`example_webhook_receiver::sign`]).
//! `kit.toml` beside this crate audits it with the conformance kit.
use std::path::Path;
use std::sync::Arc;

use axum_idempotency::SqliteStore;
use axum_idempotency::clock::SystemClock;
use example_webhook_receiver::{DEMO_BILLING, DEMO_SHOP, Sender, app};

fn sender(name: &str, var: &str, demo: &str) -> Result<Sender, String> {
    let whsec = std::env::var(var).unwrap_or_else(|_| demo.to_owned());
    Sender::from_whsec(name, &whsec)
        .ok_or_else(|| format!("{var} is not a Standard Webhooks secret (whsec_ and base64)"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let senders = vec![
        sender("billing", "BILLING_WEBHOOK_SECRET", DEMO_BILLING)?,
        sender("shop", "SHOP_WEBHOOK_SECRET", DEMO_SHOP)?,
    ];
    let store = SqliteStore::open(Path::new("webhooks.db")).await?;
    let app = app(store, Arc::new(SystemClock), senders).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    eprintln!("webhook receiver on http://127.0.0.1:3001 (senders billing, shop)");
    axum::serve(listener, app).await?;
    Ok(())
}
