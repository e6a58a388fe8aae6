//! sandboxd's own images (`sandboxd/…`) come from this host only.
//!
//! They are built here from Debian packages by `deploy/images/build.sh`
//! (which `scripts/run.sh` runs). Their names are not reserved anywhere:
//! `sandboxd/postgres:17` without a registry host means Docker Hub's
//! `sandboxd` namespace, which anyone may own. So sandboxd never pulls one
//! of its own images by tag (a missing one is built, or refused with how to
//! build it), and refuses to run one that came from a registry.
//!
//! "Came from a registry" is read from what the engine records, not from a
//! label (anyone may add a label): Docker fills an image's `RepoDigests`
//! when it pulls (or pushes) it, and leaves them empty for an image built or
//! imported here. A reference pinned by digest (`…@sha256:…`) names its
//! content exactly, so it may be pulled and run like any other image.
//!
//! Pure, tested with tables.

/// The repository namespace of sandboxd's own images.
const NAMESPACE: &str = "sandboxd/";

/// The registry hosts that mean Docker Hub, where a name without a host goes.
const DOCKER_HUB: [&str; 3] = ["docker.io/", "index.docker.io/", "registry-1.docker.io/"];

/// Why one of sandboxd's own images is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnImageError {
    /// It is absent, and sandboxd never pulls its own images by tag.
    #[error(
        "image {image} is one of sandboxd's own images, which are built on this host and never \
         pulled from a registry: build it with deploy/images/build.sh (scripts/run.sh does), or \
         set --image-build-command to that script"
    )]
    NotBuilt {
        /// The image reference.
        image: String,
    },
    /// It is present but was pulled (or pushed): not the one built here.
    #[error(
        "image {image} is one of sandboxd's own images but came from a registry ({digests}), \
         not from a build on this host: remove it (docker image rm {image}) and build it with \
         deploy/images/build.sh"
    )]
    FromRegistry {
        /// The image reference.
        image: String,
        /// The registry digests Docker recorded for it.
        digests: String,
    },
}

/// Whether `reference` names one of sandboxd's own images: a repository
/// under `sandboxd/` on Docker Hub (no registry host, or Docker Hub's).
pub fn is_own(reference: &str) -> bool {
    let name = DOCKER_HUB
        .iter()
        .find_map(|hub| reference.strip_prefix(hub))
        .unwrap_or(reference);
    name.starts_with(NAMESPACE)
}

/// Whether `reference` pins its content by digest.
fn is_pinned(reference: &str) -> bool {
    reference.contains("@sha256:")
}

/// Whether sandboxd may pull `reference` when it is absent: an error saying
/// how to build it when it is one of sandboxd's own, named by tag.
pub fn may_pull(reference: &str) -> Result<(), OwnImageError> {
    if is_own(reference) && !is_pinned(reference) {
        return Err(OwnImageError::NotBuilt {
            image: reference.to_owned(),
        });
    }
    Ok(())
}

/// Whether the present image `reference`, whose registry digests Docker
/// records as `repo_digests`, may be run: one of sandboxd's own images,
/// named by tag, must have none (built on this host).
pub fn check_provenance(reference: &str, repo_digests: &[String]) -> Result<(), OwnImageError> {
    if !is_own(reference) || is_pinned(reference) || repo_digests.is_empty() {
        return Ok(());
    }
    Err(OwnImageError::FromRegistry {
        image: reference.to_owned(),
        digests: repo_digests.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_images_are_those_under_sandboxd_on_docker_hub() {
        let cases = [
            ("sandboxd/postgres:17", true),
            ("sandboxd/redis:8", true),
            ("docker.io/sandboxd/postgres:17", true),
            ("index.docker.io/sandboxd/valkey:8", true),
            ("sandboxd/postgres@sha256:abc", true),
            ("postgres:17", false),
            ("library/sandboxd:1", false),
            ("sandboxd:latest", false),
            ("localhost:5000/sandboxd/postgres:17", false),
            ("ghcr.io/someone/sandboxd/postgres:17", false),
            ("my-sandboxd/postgres:17", false),
        ];
        for (reference, own) in cases {
            assert_eq!(is_own(reference), own, "{reference}");
        }
    }

    #[test]
    fn only_own_images_named_by_tag_are_never_pulled() {
        let cases = [
            ("sandboxd/postgres:17", false),
            ("docker.io/sandboxd/postgres:17", false),
            ("sandboxd/postgres", false),
            ("sandboxd/postgres@sha256:0123", true),
            ("postgres:17", true),
            ("registry.example/team/postgres:17", true),
        ];
        for (reference, pull) in cases {
            assert_eq!(may_pull(reference).is_ok(), pull, "{reference}");
        }
        let refused = may_pull("sandboxd/postgres:17").unwrap_err().to_string();
        assert!(refused.contains("never pulled"), "{refused}");
        assert!(refused.contains("deploy/images/build.sh"), "{refused}");
    }

    #[test]
    fn an_own_image_from_a_registry_is_refused_and_one_built_here_is_not() {
        let pulled = vec!["sandboxd/postgres@sha256:0123".to_owned()];
        let cases: [(&str, &[String], bool); 6] = [
            ("sandboxd/postgres:17", &[], true),
            ("sandboxd/postgres:17", &pulled, false),
            ("docker.io/sandboxd/postgres:17", &pulled, false),
            ("sandboxd/postgres@sha256:0123", &pulled, true),
            ("postgres:17", &pulled, true),
            ("postgres:17", &[], true),
        ];
        for (reference, digests, runs) in cases {
            assert_eq!(
                check_provenance(reference, digests).is_ok(),
                runs,
                "{reference} {digests:?}"
            );
        }
        let refused = check_provenance("sandboxd/postgres:17", &pulled)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("came from a registry"), "{refused}");
        assert!(
            refused.contains("sandboxd/postgres@sha256:0123"),
            "{refused}"
        );
    }
}
