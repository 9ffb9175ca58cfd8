//! Readiness for systemd's `Type=notify` units (deploy/systemd/): a service reports READY once
//! it serves, so units ordered after it start only then, and STOPPING when it begins to
//! drain. Outside systemd (`NOTIFY_SOCKET` unset) these do nothing.

use sd_notify::NotifyState;

/// The service serves from now on; `status` is what `systemctl status` shows.
pub fn notify_ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// This process took the service over from its predecessor (an overlapping swap,
/// `systemctl reload edge-engine`): it is the unit's main process from now on, and it serves.
/// The unit needs `NotifyAccess=all`, as this is said before systemd knows this process.
/// Said before the predecessor is stopped, so systemd never sees its main process exit.
pub fn notify_took_over(status: &str) {
    send(&[NotifyState::MainPid(std::process::id()), NotifyState::Ready, NotifyState::Status(status)]);
}

/// The service stops taking work and drains.
pub fn notify_stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

fn send(states: &[NotifyState]) {
    // A manager that cannot be told is not a reason to stop serving; systemd times the unit
    // out on its own if READY never arrives.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
