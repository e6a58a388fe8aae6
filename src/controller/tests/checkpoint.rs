//! Checkpoints and resets.

use super::*;

/// The reasons and details of `sandbox`'s recorded events.
fn checkpoint_events(h: &Harness, sandbox: &SandboxId) -> Vec<(String, Option<String>, String)> {
    h.store
        .events_of(sandbox)
        .into_iter()
        .map(|(e, _)| (e.reason.as_str().to_owned(), e.detail, e.message))
        .filter(|(r, d, _)| {
            r == "checkpointed"
                || r == "reset"
                || d.as_deref()
                    .is_some_and(|d| d == "checkpoint" || d == "reset")
        })
        .collect()
}

#[tokio::test]
async fn a_checkpoint_asked_of_a_ready_sandbox_is_taken_in_its_container_and_recorded_with_an_event(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    h.store.request_checkpoint(&id("a"), "before");
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "before").as_deref(),
        Some("ready")
    );
    let ran: Vec<String> = h
        .runtime
        .execs()
        .into_iter()
        .filter(|(c, _)| *c == container)
        .map(|(_, cmd)| cmd.join(" "))
        .collect();
    assert!(
        ran.iter().any(|c| c.starts_with("echo checkpoint before")),
        "{ran:?}"
    );
    let events = checkpoint_events(&h, &id("a"));
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "checkpointed");
    assert_eq!(events[0].1.as_deref(), Some("before"));
    assert!(events[0].2.contains("0.0 MiB"), "{}", events[0].2);

    // A reset to it, then one that fails: each recorded, in order.
    let back = h.store.request_reset(&id("a"), "before");
    let unknown = h.store.request_reset(&id("a"), "never-taken");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.reset_outcome(back), Some(Ok(())));
    let refused = h.store.reset_outcome(unknown).unwrap().unwrap_err();
    assert!(
        refused.contains("no ready checkpoint never-taken"),
        "{refused}"
    );
    let events = checkpoint_events(&h, &id("a"));
    let reasons: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(reasons, ["checkpointed", "reset", "failed"]);
    // The sandbox itself is untouched: the same container serves it.
    assert_eq!(h.published(&id("a")).0, container);
    assert_eq!(
        h.metric("sandboxd_checkpoint_seconds_count{op=\"checkpoint\",result=\"ok\"}"),
        1.0
    );
    assert_eq!(
        h.metric("sandboxd_checkpoint_seconds_count{op=\"reset\",result=\"error\"}"),
        1.0
    );
}

#[tokio::test]
async fn a_reset_whose_command_fails_is_marked_failed_with_the_engines_words_and_not_retried() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.request_checkpoint(&id("a"), "broken");
    reconcile(&ctx, &id("a")).await.unwrap();
    let request = h.store.request_reset(&id("a"), "broken");
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let why = h.store.reset_outcome(request).unwrap().unwrap_err();
    assert!(
        why.contains("fakedb: the reset failed: exit code 1: reset broken"),
        "{why}"
    );
    let execs = h.runtime.execs().len();
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.runtime.execs().len(), execs, "nothing is run again");
}

#[tokio::test]
async fn a_checkpoint_asked_before_the_sandbox_is_ready_waits_for_a_later_look() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.store.request_checkpoint(&id("a"), "early");
    // This reconcile provisions: the checkpoint waits, and asks for a look.
    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(1))
    );
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "early").as_deref(),
        Some("requested")
    );
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "early").as_deref(),
        Some("ready")
    );
}

#[tokio::test]
async fn an_invalid_checkpoint_name_fails_without_running_anything() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let before = h.runtime.execs().len();
    h.store.request_checkpoint(&id("a"), "x; rm -rf /");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "x; rm -rf /").as_deref(),
        Some("failed")
    );
    assert_eq!(h.runtime.execs().len(), before);
}

#[tokio::test]
async fn checkpoints_and_resets_that_would_pass_the_memory_cap_are_refused_before_anything_is_copied(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.request_checkpoint(&id("a"), "fits");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "fits").as_deref(),
        Some("ready")
    );
    // The fake engine's checkpoint is 4096 bytes; the container is full.
    h.runtime.set_memory(1000 * 1024, 1024 * 1024);
    let before = h.runtime.execs().len();
    h.store.request_checkpoint(&id("a"), "full");
    let reset = h.store.request_reset(&id("a"), "fits");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "full").as_deref(),
        Some("failed")
    );
    let why = h.store.reset_outcome(reset).unwrap().unwrap_err();
    assert!(why.contains("holds a copy of the checkpoint"), "{why}");
    assert!(why.contains("would not fit"), "{why}");
    let copied: Vec<String> = h.runtime.execs()[before..]
        .iter()
        .map(|(_, cmd)| cmd.join(" "))
        .filter(|c| c.starts_with("echo checkpoint") || c.starts_with("echo reset"))
        .collect();
    assert!(copied.is_empty(), "nothing copied or reset: {copied:?}");
    // The baseline needs no room: it empties the data.
    let baseline = h.store.request_reset(&id("a"), "baseline");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.reset_outcome(baseline), Some(Ok(())));
}
