//! Serves the notes app on 127.0.0.1:3000 with `./notes.db`. Send the same POST twice:
//!   curl -si localhost:3000/notes -H 'x-user: ann' -H 'Idempotency-Key: k1' \
//!        -H 'content-type: application/json' -d '{"text":"hi"}'
use axum_idempotency::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = SqliteStore::recommended_options("sqlite://notes.db")?;
    let app = example_idempotent_notes::app(sqlx::SqlitePool::connect_with(options).await?).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
