//! The two traits a user implements: [`Model`] (what is cached) and [`Loader`] (how to get it).

use std::future::Future;
use std::pin::Pin;

use crate::ModelId;

/// A boxed error from user code (a loader or an unload hook).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A model held by a [`Multiplexer`](crate::Multiplexer).
///
/// Both methods have defaults, so a plain type needs one line: `impl Model for MyModel {}`.
/// Its memory is then released by its `Drop` when it is unloaded.
///
/// ```
/// use modelmux_cache::{BoxError, Model};
///
/// struct Weights(Vec<f32>);
///
/// impl Model for Weights {
///     fn size_bytes(&self) -> Option<u64> {
///         Some((self.0.len() * size_of::<f32>()) as u64)
///     }
///
///     async fn unload(self) -> Result<(), BoxError> {
///         // Free device memory, close files, tell an engine to drop an adapter...
///         drop(self.0);
///         Ok(())
///     }
/// }
/// ```
pub trait Model: Send + Sync + 'static {
    /// How many bytes this model occupies, counted against `max_bytes`.
    ///
    /// `None` (the default) means "unknown": the model then counts only against `max_models`.
    fn size_bytes(&self) -> Option<u64> {
        None
    }

    /// Releases the model's resources. Called exactly once per successful load, after the model
    /// has been evicted and the last [`ModelGuard`](crate::ModelGuard) on it has been dropped.
    ///
    /// The default does nothing beyond dropping `self`. An error or a panic here is contained:
    /// it is logged, counted in [`MetricsSnapshot::unload_failures`](crate::MetricsSnapshot) and
    /// reported in the [`Unloaded`](crate::ModelEventKind::Unloaded) event; the capacity the model
    /// held is released either way.
    fn unload(self) -> impl Future<Output = Result<(), BoxError>> + Send
    where
        Self: Sized,
    {
        async { Ok(()) }
    }
}

/// Loads models by id. Implemented for any `Fn(ModelId) -> impl Future<Output = Result<M, E>>`,
/// so a closure is usually enough:
///
/// ```
/// use modelmux_cache::{Model, ModelId, Multiplexer};
///
/// struct Echo(String);
/// impl Model for Echo {}
///
/// # tokio_test();
/// # fn tokio_test() {
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(async {
/// let models = Multiplexer::builder()
///     .max_models(3)
///     .build(|id: ModelId| async move { Ok::<_, std::io::Error>(Echo(id.to_string())) });
/// let model = models.get("42").await.unwrap();
/// assert_eq!(model.0, "42");
/// # });
/// # }
/// ```
///
/// Implement the trait on a type when the loader has state, or can check a model cheaply before
/// loading it ([`probe`](Loader::probe)): a missing model then fails without evicting anything,
/// and a known size lets the byte cap be enforced exactly.
pub trait Loader<M>: Send + Sync + 'static {
    /// Loads the model named `id`. Runs on its own task: a caller that stops waiting does not
    /// cancel it, and other callers asking for the same id share its result.
    fn load(&self, id: &ModelId) -> impl Future<Output = Result<M, BoxError>> + Send;

    /// Checks, cheaply and before any room is made for it, that `id` can be loaded, and
    /// returns the size it will report if that is known (for example a `HEAD` of the object in
    /// a store, or a file's metadata). The default knows nothing: `Ok(None)`.
    ///
    /// Room for a load is made before the loader runs (a loading model occupies memory, so it
    /// counts against the caps), which may evict an idle model. An error here fails the get
    /// without evicting anything, so a request for a model that does not exist costs the cache
    /// nothing. It is remembered like any load failure, and bounded by the same `load_timeout`.
    ///
    /// With `Ok(None)`, the reservation is the mean size of the models already loaded: the
    /// models a multiplexer serves are usually of one shape, so this is a close guess. It is
    /// corrected to the real size as soon as the load finishes.
    fn probe(&self, id: &ModelId) -> impl Future<Output = Result<Option<u64>, BoxError>> + Send {
        let _ = id;
        async { Ok(None) }
    }
}

impl<M, F, Fut, E> Loader<M> for F
where
    F: Fn(ModelId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M, E>> + Send,
    E: Into<BoxError>,
{
    async fn load(&self, id: &ModelId) -> Result<M, BoxError> {
        (self)(id.clone()).await.map_err(Into::into)
    }
}

/// The object-safe form of [`Loader`] the multiplexer stores.
pub(crate) trait DynLoader<M>: Send + Sync + 'static {
    fn load_boxed(&self, id: ModelId) -> BoxFuture<'_, Result<M, BoxError>>;
    fn probe_boxed(&self, id: ModelId) -> BoxFuture<'_, Result<Option<u64>, BoxError>>;
}

/// A boxed, sendable future (what the object-safe loader returns).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl<M, L: Loader<M>> DynLoader<M> for L {
    fn load_boxed(&self, id: ModelId) -> BoxFuture<'_, Result<M, BoxError>> {
        Box::pin(async move { self.load(&id).await })
    }

    fn probe_boxed(&self, id: ModelId) -> BoxFuture<'_, Result<Option<u64>, BoxError>> {
        Box::pin(async move { self.probe(&id).await })
    }
}
