//! Generated gRPC types and stubs (every field is documented in the `.proto` files), and the
//! transport the services share (`transport`: Unix sockets, TCP, the internal auth token), and
//! readiness notifications to systemd (`systemd`).

pub mod systemd;
pub mod transport;

pub mod engine {
    pub mod v1 {
        tonic::include_proto!("edge.engine.v1");
    }
}

pub mod cache {
    pub mod v1 {
        tonic::include_proto!("edge.cache.v1");
    }
}
