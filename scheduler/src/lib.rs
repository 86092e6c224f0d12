//! Bounded admission, dynamic batching and the engine thread (issue 3). Not built yet: today the
//! runtime calls the model directly, one request at a time.
