//! The images containers are made from: what is present locally, and
//! pulling what is not.

use super::RuntimeError;
use async_trait::async_trait;
use std::collections::HashMap;

/// The runtime's local images.
#[async_trait]
pub trait Images: Send + Sync {
    /// The labels of `image` if it is present locally, `None` if not.
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError>;
    /// The id of `image` if it is present locally, `None` if not.
    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError>;
    /// Pulls `image`.
    async fn pull(&self, image: &str) -> Result<(), RuntimeError>;
}
