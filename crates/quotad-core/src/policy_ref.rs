//! [`PolicyRef`]: which policy a request counts under, by name or inline.
//!
//! The server and the client both speak of a policy this way; defining it
//! here, beside [`Policy`], gives them one type rather than two that could
//! drift apart. Turning a name into a policy is the server's job, so a name
//! here is only a name.

use crate::policy::Policy;

/// Which policy a request counts under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PolicyRef {
    /// A named policy from the server's configuration.
    Named(String),
    /// A policy given in the request (when the server allows it).
    Inline(Policy),
}
