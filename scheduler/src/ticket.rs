//! The handle a submitter holds: await it for the answer, drop it to cancel.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::outcome::{Answer, Failure};
use crate::queue::ReplyReceiver;
use crate::shared::Shared;

/// An admitted request. Resolves (as a future, or with [`Ticket::wait_blocking`]) to the
/// probabilities of all its questions in order, or a [`Failure`]. Dropping it before it resolves
/// cancels the request: its queued questions leave the queue at once (freeing their capacity) and
/// are never computed.
pub struct Ticket {
    id: u64,
    receiver: Option<ReplyReceiver>,
    shared: Arc<Shared>,
}

impl Ticket {
    pub(crate) fn new(id: u64, receiver: ReplyReceiver, shared: Arc<Shared>) -> Self {
        Self {
            id,
            receiver: Some(receiver),
            shared,
        }
    }

    /// The request's id, unique within this scheduler (for logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Blocks the calling thread until the request is answered. Must not be called from inside
    /// an async runtime (await the ticket there).
    pub fn wait_blocking(mut self) -> Result<Answer, Failure> {
        match self.receiver.take() {
            Some(receiver) => receiver
                .blocking_recv()
                .unwrap_or(Err(Failure::ShuttingDown)),
            None => Err(Failure::ShuttingDown),
        }
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("resolved", &self.receiver.is_none())
            .finish()
    }
}

impl Future for Ticket {
    type Output = Result<Answer, Failure>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(receiver) = self.receiver.as_mut() else {
            // Polled again after it resolved.
            return Poll::Ready(Err(Failure::ShuttingDown));
        };
        match Pin::new(receiver).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(reply) => {
                self.receiver = None;
                // A dropped sender only happens when the scheduler is torn down.
                Poll::Ready(reply.unwrap_or(Err(Failure::ShuttingDown)))
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            self.shared.cancel(self.id);
        }
    }
}
