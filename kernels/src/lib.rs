//! The backend interface the model is written against, and the CPU reference backend (f32, the
//! oracle every other backend is tested against).
