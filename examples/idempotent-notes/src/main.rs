//! Serves the notes app on 127.0.0.1:3000 with `./notes.db`. Send the same POST twice:
//!   curl -si localhost:3000/notes -H 'x-user: ann' -H 'Idempotency-Key: k1' \
//!        -H 'content-type: application/json' -d '{"text":"hi"}'
use std::path::Path;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app =
        example_idempotent_notes::open(Path::new("notes.db"), Duration::from_secs(3600)).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
