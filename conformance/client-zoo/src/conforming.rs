//! The conforming client: `idem-client` as its README tells a reqwest user to use it, the one
//! middleware line with the default policy and automatic keys. Only the jitter is seeded (and
//! the reqwest client ignores proxies from the environment, see `crate::http_client`).

use idem_client::RetryMiddleware;
use reqwest::header::CONTENT_TYPE;
use reqwest_middleware::ClientBuilder;

/// Posts [`crate::BODY`] to `url` through idem-client; true iff the final answer is a 2xx.
pub(crate) async fn call(url: &str, seed: u64) -> bool {
    let client = ClientBuilder::new(crate::http_client())
        .with(RetryMiddleware::default().with_seed(seed))
        .build();
    let sent = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(crate::BODY)
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let report = resp.extensions().get::<idem_client::RetryReport>();
            tracing::info!(
                status = resp.status().as_u16(),
                attempts = report.map(|r| r.attempts),
                stopped = ?report.and_then(|r| r.stopped.as_ref()),
                "idem-client answered"
            );
            resp.status().is_success()
        }
        Err(e) => {
            tracing::info!(error = %e, "idem-client gave up without an answer");
            false
        }
    }
}
