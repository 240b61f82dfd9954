//! Serves the orders app on `DATABASE_URL` (PostgreSQL), listening on
//! `LISTEN` (default 127.0.0.1:0); prints `listening on http://ADDR` once it
//! accepts connections. Start it twice on one database.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL=postgres://...")?;
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:0".into());
    let app = example_two_processes_postgres::app(&url).await?;
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
