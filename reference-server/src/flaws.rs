//! Deliberate flaws, for proving that the conformance kit can fail.
//!
//! Each [`Flaw`] is a small, clearly marked deviation from the contract
//! that real servers have shipped. They exist only in builds with the
//! `flaws` cargo feature, switched on one at a time with `--flaw NAME`; in a
//! normal build [`Flaws::on`] is a constant `false`, the `--flaw` flag does
//! not exist, and the wrappers below are not compiled.
//!
//! They live at the *edge* of the engine, never inside it: the library
//! (`axum-idempotency`) has no flaw in it. Each one is either an
//! alternative rule given to the engine through its ordinary configuration,
//! or a wrapper around the routes, the way a careless application would
//! break the contract around a correct library:
//!
//! | flaw | how |
//! |---|---|
//! | `keys-expire-early` | the engine's replay window is 60 s; the published one is unchanged |
//! | `store-5xx` | the engine's failure policy is `store_everything` |
//! | `no-fingerprint-check` | a fingerprint policy that ignores the request |
//! | `global-keys` | a middleware after authentication scopes every key to one caller |
//! | `replay-drops-headers` | a middleware strips replays down to `Content-Type` |
//! | `check-then-insert` | a wrapper that reads the key and, when absent, runs the handler with no claim and writes the record at the end |
//! | `no-in-flight-state` | a wrapper that runs a duplicate the engine answered 409 in-use with no claim |

use std::fmt;

/// One deliberate deviation from the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
#[non_exhaustive]
pub enum Flaw {
    /// Read the key, and if it is absent execute and store the response at
    /// the end: two concurrent duplicates both pass the check and both
    /// execute. Breaks `idem.claim.atomic`, `idem.concurrency.single-effect`.
    CheckThenInsert,
    /// Replay a stored response whatever the new request's fingerprint.
    /// Breaks `idem.fingerprint.mismatch`.
    NoFingerprintCheck,
    /// Scope keys globally instead of per caller: one caller's key replays
    /// another caller's response. Breaks `idem.scope.caller`.
    GlobalKeys,
    /// A duplicate that arrives while its key is in flight executes too.
    /// Breaks `idem.inflight.conflict`.
    NoInFlightState,
    /// Store 5xx responses and replay them. Breaks `idem.failure.5xx-not-stored`.
    #[value(name = "store-5xx")]
    Store5xx,
    /// Replays omit `Idempotent-Replayed`, `Location` and `ETag`. Breaks
    /// `idem.replay.marker`, `idem.replay.verbatim`.
    ReplayDropsHeaders,
    /// Keys stop replaying after 60 seconds instead of the published window.
    /// Breaks `idem.window.replay`.
    KeysExpireEarly,
}

impl Flaw {
    /// The `--flaw` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckThenInsert => "check-then-insert",
            Self::NoFingerprintCheck => "no-fingerprint-check",
            Self::GlobalKeys => "global-keys",
            Self::NoInFlightState => "no-in-flight-state",
            Self::Store5xx => "store-5xx",
            Self::ReplayDropsHeaders => "replay-drops-headers",
            Self::KeysExpireEarly => "keys-expire-early",
        }
    }
}

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The set of flaws switched on (always empty without the `flaws` feature).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flaws(Vec<Flaw>);

impl Flaws {
    /// No flaws: the conforming server.
    pub fn none() -> Self {
        Self::default()
    }

    /// The given flaws. Without the `flaws` feature the list is ignored.
    pub fn from_list(list: Vec<Flaw>) -> Self {
        if cfg!(feature = "flaws") {
            Self(list)
        } else {
            Self::default()
        }
    }

    /// Whether `flaw` is switched on.
    #[inline]
    pub fn on(&self, flaw: Flaw) -> bool {
        cfg!(feature = "flaws") && self.0.contains(&flaw)
    }

    /// The flaws switched on.
    pub fn list(&self) -> &[Flaw] {
        &self.0
    }
}

impl Flaws {
    /// The engine settings the flaws change. The server keeps publishing
    /// the contract's policy: a flawed server does not announce its flaw.
    pub fn engine_config(
        &self,
        mut config: axum_idempotency::EngineConfig,
    ) -> axum_idempotency::EngineConfig {
        if self.on(Flaw::KeysExpireEarly) {
            config.replay_window = std::time::Duration::from_secs(60);
        }
        if self.on(Flaw::Store5xx) {
            config.failure_policy = idem_spec::policy::FailurePolicy::StoreEverything;
        }
        #[cfg(feature = "flaws")]
        if self.on(Flaw::NoFingerprintCheck) {
            config.fingerprint = std::sync::Arc::new(edge::IgnoreRequest);
        }
        config
    }
}

/// The wrappers (compiled only with the `flaws` feature).
#[cfg(feature = "flaws")]
pub mod edge {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use axum::body::{Body, Bytes};
    use axum::extract::Request;
    use axum::http::{HeaderName, Response, StatusCode};
    use axum::middleware::Next;
    use axum_idempotency::engine::{FingerprintPolicy, stored_response};
    use axum_idempotency::store::{DbTx, KeyStore, MySqlTx, PgTx, SqliteTx};
    use axum_idempotency::{
        Caller, Fingerprint, IdemTx, IdempotencyKey, IdempotencyService, KeyId, Store, with_conn,
    };
    use idem_spec::ErrorCode;
    use tower::util::BoxCloneSyncService;
    use tower::{Service, ServiceExt};

    use super::{Flaw, Flaws};
    use crate::api::AppState;

    /// A boxed route service.
    pub type RouteService = BoxCloneSyncService<Request, Response<Body>, Infallible>;

    /// `no-fingerprint-check`: every request under a key is "the same".
    #[derive(Debug, Clone, Copy)]
    pub struct IgnoreRequest;

    impl FingerprintPolicy for IgnoreRequest {
        fn fingerprint(&self, _: &str, _: &str, _: Option<&str>, _: &[u8]) -> Fingerprint {
            Fingerprint::compute("", "", None, b"")
        }
    }

    /// `global-keys`: runs after authentication and replaces the caller the
    /// keys are scoped to (the handlers' own principal is untouched).
    pub async fn global_scope(mut req: Request, next: Next) -> Response<Body> {
        req.extensions_mut().insert(Caller::new("*"));
        next.run(req).await
    }

    /// `replay-drops-headers`: a replay keeps only `Content-Type`.
    pub async fn drop_replay_headers(req: Request, next: Next) -> Response<Body> {
        let mut response = next.run(req).await;
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        if replayed {
            let keep = response
                .headers()
                .get(axum::http::header::CONTENT_TYPE)
                .cloned();
            response.headers_mut().clear();
            if let Some(ct) = keep {
                response
                    .headers_mut()
                    .insert(axum::http::header::CONTENT_TYPE, ct);
            }
        }
        response
    }

    impl Flaws {
        /// The route-level wrappers around `real` (the route with its
        /// idempotency layer) and `bare` (the same handler without it), or
        /// `None` when no route-level flaw is on.
        pub fn wrap_route<S>(
            &self,
            state: &AppState,
            real: IdempotencyService<S, Store>,
            bare: S,
            replay_headers: &[HeaderName],
        ) -> Option<RouteService>
        where
            S: Service<Request, Response = Response<Body>, Error = Infallible>
                + Clone
                + Send
                + Sync
                + 'static,
            S::Future: Send + 'static,
        {
            let mode = if self.on(Flaw::CheckThenInsert) {
                Mode::CheckThenInsert
            } else if self.on(Flaw::NoInFlightState) {
                Mode::NoInFlight
            } else {
                return None;
            };
            Some(BoxCloneSyncService::new(Naive {
                mode,
                state: state.clone(),
                real,
                bare,
                replay_headers: replay_headers.to_vec(),
            }))
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Mode {
        CheckThenInsert,
        NoInFlight,
    }

    /// A naive server around a correct one.
    #[derive(Clone)]
    struct Naive<S> {
        mode: Mode,
        state: AppState,
        real: IdempotencyService<S, Store>,
        bare: S,
        replay_headers: Vec<HeaderName>,
    }

    impl<S> Service<Request> for Naive<S>
    where
        S: Service<Request, Response = Response<Body>, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request) -> Self::Future {
            let this = self.clone();
            Box::pin(async move { Ok(this.serve(req).await) })
        }
    }

    /// Inserts or overwrites a complete record: the "store the response at
    /// the end" of a check-then-insert server.
    const OVERWRITE_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, \
         state, recovery_point, generation, created_at, replay_until, expires_at, completed_at, \
         request_method, request_path, request_content_type, request_body, \
         response_status, response_headers, response_body) \
         VALUES ($1, $2, $3, 'complete', 'finished', 1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
         ON CONFLICT (caller, idem_key) DO UPDATE SET fingerprint = excluded.fingerprint, \
           state = 'complete', created_at = excluded.created_at, replay_until = excluded.replay_until, \
           expires_at = excluded.expires_at, completed_at = excluded.completed_at, \
           response_status = excluded.response_status, response_headers = excluded.response_headers, \
           response_body = excluded.response_body";

    /// The same on MySQL, whose upsert is `ON DUPLICATE KEY UPDATE`.
    const OVERWRITE_SQL_MYSQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, \
         state, recovery_point, generation, created_at, replay_until, expires_at, completed_at, \
         request_method, request_path, request_content_type, request_body, \
         response_status, response_headers, response_body) \
         VALUES ($1, $2, $3, 'complete', 'finished', 1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
         ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), \
           state = 'complete', created_at = VALUES(created_at), replay_until = VALUES(replay_until), \
           expires_at = VALUES(expires_at), completed_at = VALUES(completed_at), \
           response_status = VALUES(response_status), response_headers = VALUES(response_headers), \
           response_body = VALUES(response_body)";

    impl<S> Naive<S>
    where
        S: Service<Request, Response = Response<Body>, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        async fn serve(mut self, req: Request) -> Response<Body> {
            let (mut parts, body) = req.into_parts();
            let Ok(body) =
                axum::body::to_bytes(body, self.state.engine.config().max_body_bytes).await
            else {
                return StatusCode::PAYLOAD_TOO_LARGE.into_response_body();
            };
            let rebuild = |parts: &axum::http::request::Parts, body: &Bytes| {
                Request::from_parts(parts.clone(), Body::from(body.clone()))
            };
            match self.mode {
                Mode::CheckThenInsert => {
                    // FLAW(check-then-insert): read, and if absent run with
                    // no claim; two duplicates that both read "absent" both
                    // execute.
                    let id = parts.extensions.get::<Caller>().cloned().zip(
                        parts
                            .headers
                            .get("idempotency-key")
                            .and_then(|v| IdempotencyKey::parse_bytes(v.as_bytes()).ok()),
                    );
                    let Some((caller, key)) = id else {
                        return call(&mut self.real, rebuild(&parts, &body)).await;
                    };
                    let id = KeyId::new(caller, key);
                    match self.state.store.lookup(&id).await {
                        Ok(None) => self.unclaimed(parts, body, Some(id)).await,
                        _ => call(&mut self.real, rebuild(&parts, &body)).await,
                    }
                }
                Mode::NoInFlight => {
                    // FLAW(no-in-flight-state): a duplicate the engine holds
                    // off as in flight executes anyway.
                    parts.headers.remove("prefer");
                    let response = call(&mut self.real, rebuild(&parts, &body)).await;
                    if !self.is_in_use(&response) {
                        return response;
                    }
                    // Like a naive server that retries its own transaction
                    // while the store is busy: on SQLite the request in
                    // flight holds the writer past the store's wait bound, so
                    // the first tries answer 503; once the writer is free the
                    // duplicate executes (bounded: 30 s in all).
                    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
                    loop {
                        let r = self
                            .clone()
                            .unclaimed(parts.clone(), body.clone(), None)
                            .await;
                        if r.status() != StatusCode::SERVICE_UNAVAILABLE
                            || tokio::time::Instant::now() >= until
                        {
                            return r;
                        }
                    }
                }
            }
        }

        fn is_in_use(&self, response: &Response<Body>) -> bool {
            let in_use = ErrorCode::IdempotencyKeyInUse;
            response.status().as_u16() == in_use.status(self.state.profile)
                && response.headers().contains_key("retry-after")
        }

        /// Runs the bare handler in a plain transaction (no claim, no writer
        /// gate: SQLite gets a deferred BEGIN whose first write waits in the
        /// busy handler); with `record`, writes the key's record at the end.
        async fn unclaimed(
            mut self,
            mut parts: axum::http::request::Parts,
            body: Bytes,
            record: Option<KeyId>,
        ) -> Response<Body> {
            let tx = match &self.state.store {
                Store::Sqlite(s) => s
                    .pool()
                    .begin()
                    .await
                    .map(|t| DbTx::Sqlite(SqliteTx::from_transaction(t))),
                Store::Postgres(s) => s
                    .pool()
                    .begin()
                    .await
                    .map(|tx| DbTx::Postgres(PgTx::from_transaction(tx))),
                Store::MySql(s) => s
                    .pool()
                    .begin()
                    .await
                    .map(|tx| DbTx::MySql(MySqlTx::from_transaction(tx))),
                _ => return StatusCode::INTERNAL_SERVER_ERROR.into_response_body(),
            };
            let Ok(tx) = tx else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response_body();
            };
            let slot = IdemTx::<Store>::new(tx);
            parts.extensions.insert(slot.clone());
            let method = parts.method.as_str().to_owned();
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let content_type = parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let response = call(
                &mut self.bare,
                Request::from_parts(parts, Body::from(body.clone())),
            )
            .await;
            let Some(mut tx) = slot.take().await else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response_body();
            };
            let (resp_parts, resp_body) = response.into_parts();
            let Ok(resp_body) = axum::body::to_bytes(resp_body, usize::MAX).await else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response_body();
            };
            let status = resp_parts.status.as_u16();
            let keep = (200..500).contains(&status);
            let outcome = async {
                if let (true, Some(id)) = (keep, &record) {
                    let engine = &self.state.engine;
                    let now = engine.clock().now_ms();
                    let window = i64::try_from(engine.config().replay_window.as_millis())
                        .unwrap_or(i64::MAX);
                    let retention =
                        i64::try_from(engine.config().retention.as_millis()).unwrap_or(i64::MAX);
                    let fp = engine.config().fingerprint.fingerprint(
                        &method,
                        &path,
                        content_type.as_deref(),
                        &body,
                    );
                    let stored = stored_response(
                        status,
                        &resp_parts.headers,
                        &self.replay_headers,
                        &resp_body,
                    );
                    let headers =
                        serde_json::to_string(&stored.headers).unwrap_or_else(|_| "[]".into());
                    with_conn!(&mut tx, c => {
                        let overwrite = if axum_idempotency::store::is_mysql(&*c) {
                            OVERWRITE_SQL_MYSQL
                        } else {
                            OVERWRITE_SQL
                        };
                        sqlx::query(&axum_idempotency::store::sql(&*c, overwrite))
                            .bind(id.caller().as_str())
                            .bind(id.key().as_str())
                            .bind(fp.to_hex())
                            .bind(now)
                            .bind(now.saturating_add(window))
                            .bind(now.saturating_add(retention))
                            .bind(now)
                            .bind(&method)
                            .bind(&path)
                            .bind(content_type.as_deref())
                            .bind(body.as_ref())
                            .bind(i64::from(status))
                            .bind(&headers)
                            .bind(&stored.body)
                            .execute(&mut *c)
                            .await?;
                    });
                }
                if keep {
                    self.state.store.commit(tx).await
                } else {
                    self.state.store.rollback(tx).await
                }
            };
            let result: axum_idempotency::Result<()> = outcome.await;
            if result.is_err() {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response_body();
            }
            Response::from_parts(resp_parts, Body::from(resp_body))
        }
    }

    async fn call<S>(svc: &mut S, req: Request) -> Response<Body>
    where
        S: Service<Request, Response = Response<Body>, Error = Infallible>,
    {
        match svc.ready().await {
            Ok(svc) => match svc.call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            },
            Err(never) => match never {},
        }
    }

    trait Bare {
        fn into_response_body(self) -> Response<Body>;
    }

    impl Bare for StatusCode {
        fn into_response_body(self) -> Response<Body> {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = self;
            r
        }
    }
}
