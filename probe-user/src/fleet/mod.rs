//! A serving group's deep dives in a shared store: the S3 client, the group's index, and the
//! daemon's upload thread. (The webhook that starts a group's deep dive is in `api`, the
//! `stallscope fleet` commands in `cli`.)

pub mod index;
pub mod store;
pub mod upload;
