//! A thread that runs until it is asked to stop, then hands back what it made: the shape of
//! a capture's drainer, stack sampler and telemetry sampler. Asking and waiting are apart, so
//! that the daemon's loop can ask, go on, and collect once [`Worker::is_finished`].

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

/// A running thread and its stop flag.
pub struct Worker<T> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<T>,
}

impl<T: Send + 'static> Worker<T> {
    /// Spawns thread `name` running `body`, which returns soon after the flag it is given
    /// is raised.
    pub fn spawn(
        name: &str,
        body: impl FnOnce(&AtomicBool) -> T + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Self { stop, handle })
    }

    /// Raises the stop flag without waiting.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the thread has returned ([`Worker::stop`] does not wait then).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Raises the stop flag and waits for the thread's result (`Err`: it panicked).
    pub fn stop(self) -> std::thread::Result<T> {
        self.request_stop();
        self.handle.join()
    }
}
