//! The store seam: [`Store`], any store this build has, chosen at run time
//! from a URL, written once for every store.
//!
//! Every store is a module of its own (`sqlite`, `postgres`, `mysql`) with a
//! type implementing [`KeyStore`], [`StagedJobs`] and [`StoreBackend`]. The
//! list at the bottom of this file, one line per store, is the only place
//! that enumerates them: the [`Store`] and [`DbTx`] enums, the delegation of
//! every [`KeyStore`] and [`StagedJobs`] method, choosing a store from a URL,
//! [`with_conn!`](crate::with_conn) and [`with_pool!`](crate::with_pool) are
//! all generated from it.
//!
//! ## Adding a store
//!
//! 1. A module `store/NAME.rs` behind a cargo feature `NAME`, with a store
//!    type (`FooStore`), its transaction type (derefs to the driver's
//!    connection, so endpoints run their SQL on it) and implementations of
//!    [`KeyStore`] (the claim protocol: read the module docs of
//!    [`crate::store`] first, and make the start-up claim check of
//!    [`StoreBackend::migrate_store`] real), [`StagedJobs`] and [`StoreBackend`].
//! 2. One line in the `stores!` list below:
//!    `Foo("NAME", __idem_if_NAME) => foo::FooStore, foo::FooTx, sqlx::FooConnection;`.
//! 3. Its migrations under `migrations/NAME/` and in [`crate::migrate`].
//!
//! Then run the store test suite on it (`tests/store.rs`, through
//! `idem_test_support::both!`). A store whose transactions are not a sqlx
//! connection (a key-value store, where business writes cannot join the
//! claim's transaction) does not fit this list: it is a [`KeyStore`] of its
//! own, used directly, and the book must say what it does not guarantee.

use std::future::Future;

use idem_spec::Fingerprint;

use super::ops::StagedJob;
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    ReapBatch, SingleTx, StagedJobs, StoreOptions, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};

/// What [`Store`] needs of a store beyond [`KeyStore`]: its name, the URL
/// schemes it serves, and its start-up.
pub trait StoreBackend: KeyStore + StagedJobs + Sized {
    /// Short name ("sqlite", "postgres", "mysql"): logs, `/readyz`, metrics.
    const NAME: &'static str;

    /// Whether `url` names a database of this store.
    fn accepts(url: &str) -> bool;

    /// Opens a pool on `url` with the settings this library is tested with.
    /// (Not `Send`-bounded, like the migration below: start-up code runs
    /// them once, and sqlx's executor futures trip a compiler limitation on
    /// `Send` through higher-ranked lifetimes.)
    fn connect_url(url: &str, options: &StoreOptions) -> impl Future<Output = Result<Self>>;

    /// Creates or updates the key table, then checks that the claim
    /// excludes on this database ([`Error::ClaimUnsafe`] if it does not).
    fn migrate_store(&self) -> impl Future<Output = Result<()>>;

    /// One connection and one trivial statement (a readiness probe).
    fn ping_store(&self) -> impl Future<Output = Result<()>> + Send;

    /// Closes the pool (waits for connections to be returned).
    fn close_store(&self) -> impl Future<Output = ()> + Send;
}

fn wrong_backend() -> Error {
    Error::Internal("a transaction of one store was given to another".into())
}

fn claimed<T>(o: ClaimOutcome<T>, wrap: fn(T) -> DbTx) -> ClaimOutcome<DbTx> {
    match o {
        ClaimOutcome::Claimed(Claimed { tx, fence }) => ClaimOutcome::Claimed(Claimed {
            tx: wrap(tx),
            fence,
        }),
        ClaimOutcome::Busy => ClaimOutcome::Busy,
        ClaimOutcome::Taken => ClaimOutcome::Taken,
    }
}

fn wrap_observed<T>(o: Observed<T>, wrap: fn(T) -> DbTx) -> Observed<DbTx> {
    Observed {
        record: o.record,
        busy: o.busy,
        tx: o.tx.map(wrap),
    }
}

/// Generates everything that enumerates the stores from the one list below.
/// `$d` is a `$` token, so the macros it defines can have metavariables.
macro_rules! stores {
    ($d:tt $(
        $(#[$doc:meta])*
        $variant:ident($feature:literal, $gate:ident) => $store:ty, $tx:ty, $conn:ty;
    )*) => {
        /// A key store chosen at run time (from a URL): one variant per
        /// store this build has (each behind its cargo feature). Its
        /// transaction is [`DbTx`]; [`with_conn!`](crate::with_conn) runs
        /// the same sqlx code on whichever connection it holds, and
        /// [`with_pool!`](crate::with_pool) on whichever pool. An
        /// application on one database uses that store directly and needs
        /// neither. New stores add variants, hence `non_exhaustive`.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub enum Store {
            $( $(#[$doc])* #[cfg(feature = $feature)] $variant($store), )*
        }

        /// A write transaction of a [`Store`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum DbTx {
            $( #[doc = concat!("A ", $feature, " transaction.")]
               #[cfg(feature = $feature)] $variant($tx), )*
        }

        /// A borrowed connection of any store; see [`with_conn!`](crate::with_conn).
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum DbConn<'a> {
            $( #[doc = concat!("A ", $feature, " connection.")]
               #[cfg(feature = $feature)] $variant(&'a mut $conn), )*
        }

        impl DbTx {
            /// The connection the transaction runs on.
            pub fn conn(&mut self) -> DbConn<'_> {
                match self {
                    $( #[cfg(feature = $feature)] Self::$variant(tx) => DbConn::$variant(tx), )*
                }
            }
        }

        impl Store {
            /// Opens a pool on `database_url` with the store whose scheme it
            /// names (`sqlite://PATH` or `sqlite::memory:`, `postgres://...`,
            /// `mysql://...`, each when its feature is on) and that store's
            /// tested settings. It does not migrate: call [`Store::migrate`].
            pub async fn connect_with(database_url: &str, options: &StoreOptions) -> Result<Self> {
                $(
                    #[cfg(feature = $feature)]
                    if <$store as StoreBackend>::accepts(database_url) {
                        return Ok(Self::$variant(
                            <$store as StoreBackend>::connect_url(database_url, options).await?,
                        ));
                    }
                )*
                #[allow(unused_mut)]
                let mut served: Vec<&str> = Vec::new();
                $( #[cfg(feature = $feature)] served.push(concat!($feature, "://...")); )*
                Err(Error::Config(format!(
                    "unsupported database URL {database_url:?}: this build serves {}",
                    served.join(", ")
                )))
            }

            /// Creates or updates the key table and checks the claim (see
            /// [`crate::migrate`] and [`StoreBackend::migrate_store`]).
            pub async fn migrate(&self) -> Result<()> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.migrate_store().await, )* }
            }

            /// The store's name ("sqlite", "postgres", "mysql").
            pub fn backend(&self) -> &'static str {
                match self { $( #[cfg(feature = $feature)] Self::$variant(_) => <$store as StoreBackend>::NAME, )* }
            }

            /// Whether the store answers now: one connection (bounded by the
            /// acquire timeout) and `SELECT 1`. What a readiness probe asks.
            pub async fn ping(&self) -> Result<()> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.ping_store().await, )* }
            }

            /// Closes the pool (waits for connections to be returned).
            pub async fn close(&self) {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.close_store().await, )* }
            }
        }

        impl KeyStore for Store {
            type Tx = DbTx;

            async fn begin(&self) -> Result<DbTx> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => Ok(DbTx::$variant(s.begin().await?)), )* }
            }

            async fn commit(&self, tx: DbTx) -> Result<()> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.commit(tx).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn rollback(&self, tx: DbTx) -> Result<()> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.rollback(tx).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn lookup(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.lookup(id).await, )* }
            }

            fn peers_can_commit_during_claim(&self) -> bool {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.peers_can_commit_during_claim(), )* }
            }

            async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<DbTx>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => Ok(claimed(s.claim(req).await?, DbTx::$variant)), )* }
            }

            async fn observe(&self, id: &KeyId, now: Millis) -> Result<Observed<DbTx>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => Ok(wrap_observed(s.observe(id, now).await?, DbTx::$variant)), )* }
            }

            async fn begin_single(&self, req: &ClaimRequest<'_>) -> Result<SingleTx<DbTx>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => Ok(s.begin_single(req).await?.map(DbTx::$variant)), )* }
            }

            async fn record_final(
                &self,
                tx: &mut DbTx,
                req: &ClaimRequest<'_>,
                response: &StoredResponse,
                now: Millis,
            ) -> Result<Option<i64>> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.record_final(tx, req, response, now).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn record_final_and_commit(
                &self,
                tx: DbTx,
                req: &ClaimRequest<'_>,
                response: &StoredResponse,
                now: Millis,
            ) -> Result<Option<i64>> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.record_final_and_commit(tx, req, response, now).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn write_fenced(
                &self,
                tx: &mut DbTx,
                fence: &Fence,
                write: FencedWrite<'_>,
                now: Millis,
            ) -> Result<()> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.write_fenced(tx, fence, write, now).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn take_over(
                &self,
                id: &KeyId,
                fingerprint: &Fingerprint,
                now: Millis,
                lease_expires_at: Millis,
            ) -> Result<Option<TakenOver>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.take_over(id, fingerprint, now, lease_expires_at).await, )* }
            }

            async fn renew_lease(&self, fence: &Fence, now: Millis, lease_expires_at: Millis) -> Result<bool> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.renew_lease(fence, now, lease_expires_at).await, )* }
            }

            async fn release_lease(&self, fence: &Fence, now: Millis) -> Result<bool> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.release_lease(fence, now).await, )* }
            }

            async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.abandoned(now, limit).await, )* }
            }

            async fn reap(&self, now: Millis, limit: i64) -> Result<ReapBatch> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.reap(now, limit).await, )* }
            }

            async fn orphans(&self, now: Millis) -> Result<super::Orphans> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.orphans(now).await, )* }
            }

            async fn oldest_expired(&self, now: Millis) -> Result<Option<Millis>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.oldest_expired(now).await, )* }
            }
        }

        impl StagedJobs for Store {
            async fn stage(&self, tx: &mut DbTx, kind: &str, payload: &str, now: Millis) -> Result<()> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.stage(tx, kind, payload, now).await, )*
                    _ => Err(wrong_backend()),
                }
            }

            async fn staged(&self, limit: i64) -> Result<Vec<StagedJob>> {
                match self { $( #[cfg(feature = $feature)] Self::$variant(s) => s.staged(limit).await, )* }
            }

            async fn delete_job(&self, tx: &mut DbTx, id: i64) -> Result<()> {
                #[allow(unreachable_patterns)]
                match (self, tx) {
                    $( #[cfg(feature = $feature)] (Self::$variant(s), DbTx::$variant(tx)) => s.delete_job(tx, id).await, )*
                    _ => Err(wrong_backend()),
                }
            }
        }

        // The exported macros expand in the application's crate, where this
        // crate's features cannot be asked with `cfg`: each store's gate
        // macro, defined here under this crate's cfg, keeps or drops the
        // tokens of that store's arm.
        $(
            #[cfg(feature = $feature)]
            #[doc(hidden)]
            #[macro_export]
            macro_rules! $gate { ($d($d t:tt)*) => { $d($d t)* }; }
            #[cfg(not(feature = $feature))]
            #[doc(hidden)]
            #[macro_export]
            macro_rules! $gate { ($d($d t:tt)*) => {}; }
        )*

        /// Runs the same sqlx code on whichever store a [`DbTx`] holds.
        ///
        /// `with_conn!(tx, c => body)` expands `body` once per store this
        /// build has, with `c: &mut SqliteConnection`, `&mut PgConnection`
        /// or `&mut MySqlConnection`. Write SQL every store accepts
        /// (`BIGINT`/`TEXT` columns, no `RETURNING`), pass it through
        /// [`sql`](crate::store::sql) for its placeholders, and make `body`
        /// return a type every arm shares (decode rows inside it).
        ///
        /// ```
        /// # async fn demo(tx: &mut axum_idempotency::store::DbTx) -> Result<u64, axum_idempotency::Error> {
        /// use axum_idempotency::store::sql;
        /// let moved = axum_idempotency::with_conn!(tx, c => {
        ///     sqlx::query(&sql(&*c, "UPDATE accounts SET balance = balance + $1 WHERE id = $2"))
        ///         .bind(100_i64)
        ///         .bind("acc_alice_main")
        ///         .execute(&mut *c)
        ///         .await?
        ///         .rows_affected()
        /// });
        /// # Ok(moved) }
        /// ```
        #[macro_export]
        macro_rules! with_conn {
            ($d tx:expr, $d c:ident => $d body:expr) => {
                '__idem_conn: {
                    let __idem_conn = $d crate::store::DbTx::conn($d tx);
                    $(
                        $d crate::$gate! {
                            #[allow(irrefutable_let_patterns)]
                            if let $d crate::store::DbConn::$variant($d c) = __idem_conn {
                                break '__idem_conn $d body;
                            }
                        }
                    )*
                    unreachable!("a DbConn of a store this build does not have")
                }
            };
        }

        /// Runs the same sqlx code on whichever pool a [`Store`] holds (for
        /// reads outside any idempotent request, e.g. GET endpoints).
        ///
        /// `with_pool!(store, p => body)` expands `body` once per store this
        /// build has, with `p: &SqlitePool`, `&PgPool` or `&MySqlPool`.
        #[macro_export]
        macro_rules! with_pool {
            ($d store:expr, $d p:ident => $d body:expr) => {
                '__idem_pool: {
                    let __idem_store: &$d crate::store::Store = &$d store;
                    $(
                        $d crate::$gate! {
                            #[allow(irrefutable_let_patterns)]
                            if let $d crate::store::Store::$variant(__idem_s) = __idem_store {
                                let $d p = __idem_s.pool();
                                break '__idem_pool $d body;
                            }
                        }
                    )*
                    unreachable!("a Store this build does not have")
                }
            };
        }
    };
}

// The stores, one line each (see "Adding a store" above).
stores! {$
    /// The embedded default (one process per database file).
    Sqlite("sqlite", __idem_if_sqlite) => super::SqliteStore, super::SqliteTx, sqlx::SqliteConnection;
    /// For several processes on one PostgreSQL database.
    Postgres("postgres", __idem_if_postgres) => super::PgStore, super::PgTx, sqlx::PgConnection;
    /// For several processes on one MySQL or MariaDB database.
    MySql("mysql", __idem_if_mysql) => super::MySqlStore, super::MySqlTx, sqlx::MySqlConnection;
}

impl Store {
    /// Opens a pool on `database_url` with [`StoreOptions::default`] but
    /// `max_connections`. See [`Store::connect_with`].
    pub async fn connect(database_url: &str, max_connections: u32) -> Result<Self> {
        Self::connect_with(
            database_url,
            &StoreOptions::default().max_connections(max_connections),
        )
        .await
    }
}
