//! Logging through the host. On wasm the lines go to the host's log, tagged
//! with the plugin's name and version; natively (unit tests) they are kept by
//! the [`crate::testing`] harness and echoed to stderr.

use crate::Level;

/// Writes `message` at `level`.
pub fn write(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::gavel::rules::host::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    crate::testing::capture_log(level, message);
}

/// Writes a debug line.
pub fn debug(message: &str) {
    write(Level::Debug, message);
}

/// Writes an info line.
pub fn info(message: &str) {
    write(Level::Info, message);
}

/// Writes a warning.
pub fn warn(message: &str) {
    write(Level::Warn, message);
}

/// Writes an error line.
pub fn error(message: &str) {
    write(Level::Error, message);
}
