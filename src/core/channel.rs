//! The channel where a resource's ownership changes are published, and its messages: the
//! protocol crate's rule (`dlock_proto::channel`), which the clients share. The module publishes
//! with [`write_name`] and [`write_message`] (no allocation on the grant path).

pub use dlock_proto::channel::{
    MAX_GRANTED, MAX_MESSAGE, PREFIX, TAG_LEN, name, tag, write_granted, write_message, write_name,
    write_ticket_name,
};

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::vectors;

    #[test]
    fn the_shared_vectors_hold_for_the_names_and_messages_the_module_publishes() {
        let channels = vectors::load("channels.json");
        for vector in channels.as_array().expect("a list") {
            let resource = vectors::text(vector, "resource");
            assert_eq!(
                String::from_utf8_lossy(&name(resource.as_bytes())),
                vectors::text(vector, "channel")
            );
        }
        assert!(channels.as_array().is_some_and(|list| list.len() >= 10));
        let messages = vectors::load("messages.json");
        let mut checked = 0;
        for vector in messages["published"].as_array().expect("published") {
            let holder = vector.get("holder").and_then(|token| token.as_str());
            let mut buffer = [0; MAX_MESSAGE];
            let written = write_message(
                vectors::text(vector, "event"),
                vector["fence"].as_u64().expect("fence"),
                holder.map(str::as_bytes),
                &mut buffer,
            );
            assert_eq!(String::from_utf8_lossy(written), vectors::text(vector, "message"));
            checked += 1;
        }
        assert!(checked >= 5, "{checked} messages");
        for vector in vectors::load("tags.json").as_array().expect("a list") {
            let token = vectors::text(vector, "token");
            assert_eq!(format!("{:08x}", tag(token.as_bytes())), vectors::text(vector, "tag"));
        }
    }
}
