//! unix:// sockets.

use std::time::Duration;

use quotad_client::{Check, Client};

use crate::fake::{Call, Fake, serve_unix};

#[tokio::test]
async fn checks_travel_over_a_unix_socket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.sock");
    let fake = Fake::new(10, Duration::from_secs(60));
    serve_unix(&fake, &path);

    let client = Client::builder(format!("unix://{}", path.display()))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid address");
    let decision = client
        .check(&Check::named("api", "alice").cost(3))
        .await
        .expect("decided over the socket");
    assert_eq!(decision.remaining, 7);
    let connected = Client::connect(format!("unix://{}", path.display()))
        .await
        .expect("connects now");
    let peeked = connected
        .peek(&Check::named("api", "alice"))
        .await
        .expect("peeked");
    assert_eq!(peeked.remaining, 7);
    assert_eq!(
        fake.calls(),
        vec![Call::Check("alice".into()), Call::Peek("alice".into())]
    );
}
