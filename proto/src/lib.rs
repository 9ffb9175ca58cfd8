//! Generated gRPC types and stubs. Every field is documented in the `.proto` files.

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
