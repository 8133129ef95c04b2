//! What every cairn Kafka client starts from, and a producer for tests and benchmarks.

use rdkafka::config::ClientConfig;

/// The librdkafka settings every cairn Kafka client starts from: the brokers and a client id
/// that names the connector in the brokers' logs.
pub(crate) fn client_config(brokers: &str, client_id: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("client.id", client_id);
    config
}

/// Checks a `HOST:PORT[,HOST:PORT...]` broker list, so that a typo is an error naming the
/// flag's value instead of a client that retries forever.
pub(crate) fn check_brokers(brokers: &str) -> Result<(), String> {
    let mut any = false;
    for b in brokers.split(',').map(str::trim) {
        let ok = b
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(format!("Kafka brokers '{brokers}': '{b}' is not HOST:PORT"));
        }
        any = true;
    }
    if any {
        Ok(())
    } else {
        Err("no Kafka broker given".into())
    }
}

/// Writes `records` (partition, value) into `topic` at `brokers` and waits until the broker
/// has them all; for the tests and benchmarks that fill a topic. A full local queue is waited
/// out, not an error.
pub fn produce<S: AsRef<str>>(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (i32, S)>,
) -> Result<(), String> {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let fail = |e: KafkaError| format!("cannot write to Kafka topic {topic} at {brokers}: {e}");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .create()
        .map_err(fail)?;
    for (partition, value) in records {
        let mut rec = BaseRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(value.as_ref());
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(5));
                    rec = r;
                }
                Err((e, _)) => return Err(fail(e)),
            }
        }
    }
    producer.flush(Duration::from_secs(120)).map_err(fail)
}
