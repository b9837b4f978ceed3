//! The data plane's background work (keel_data's mover and cleaner) driven
//! one step at a time on a real broker, topics created as CreateTopics
//! creates them.

mod cleaner;
mod mover;
