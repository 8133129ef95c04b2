//! Kafka connectors, through librdkafka (crate `rdkafka`, re-exported for tests and tools
//! that produce or inspect topics).

mod source;

pub use rdkafka;
pub use source::{
    KafkaDeserializer, KafkaMessage, KafkaSource, KafkaSourceConfig, OffsetReset, StartFrom,
};
