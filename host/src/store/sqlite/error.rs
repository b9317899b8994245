//! rusqlite's errors as [`StoreError`]s, classified as the sqlx ones are
//! (`store/mod.rs`): busy, locked and I/O are `Unavailable` (503 with
//! `Retry-After`), a value too big is `Invalid` (400), a row that does not
//! decode is `Corrupt`.

use crate::store::StoreError;
use rusqlite::ErrorCode;

pub(crate) fn from_sqlite(e: rusqlite::Error) -> StoreError {
    use rusqlite::Error as E;
    match &e {
        E::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull => StoreError::Unavailable(e.to_string()),
            ErrorCode::TooBig => StoreError::Invalid(e.to_string()),
            _ => StoreError::Database(e.to_string()),
        },
        E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::InvalidColumnType(..)
        | E::InvalidColumnIndex(_)
        | E::InvalidColumnName(_)
        | E::Utf8Error(_) => StoreError::Corrupt(e.to_string()),
        _ => StoreError::Database(e.to_string()),
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        from_sqlite(e)
    }
}

impl From<rusqlite::types::FromSqlError> for StoreError {
    fn from(e: rusqlite::types::FromSqlError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}
