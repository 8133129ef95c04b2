//! Kafka connectors, on librdkafka (crate `rdkafka`, re-exported for tests and tools that
//! produce or inspect topics), with the few transaction requests librdkafka does not expose
//! spoken directly (`wire`).
//!
//! The source, the sink and the clients need the `kafka` feature; their configuration
//! ([`KafkaSourceConfig`], [`KafkaSinkConfig`]) is there in every build, so that a job can name
//! a Kafka input or output and fail with an error naming the feature.

#[cfg(feature = "kafka")]
mod client;
mod config;
#[cfg(feature = "kafka")]
mod sink;
#[cfg(feature = "kafka")]
mod source;
#[cfg(feature = "kafka")]
pub mod wire;

#[cfg(feature = "kafka")]
pub use client::produce;
pub use config::{
    KafkaEncoder, KafkaGuarantee, KafkaSinkConfig, KafkaSourceConfig, OffsetReset, StartFrom,
};
#[cfg(feature = "kafka")]
pub use rdkafka;
#[cfg(feature = "kafka")]
pub use sink::KafkaSink;
#[cfg(feature = "kafka")]
pub use source::{KafkaDeserializer, KafkaMessage, KafkaSource};
