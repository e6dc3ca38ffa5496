//! What a check asks for.

use std::num::NonZeroU64;

use thiserror::Error;

use crate::algorithm::Spend;
use crate::policy::{MAX_EXACT, Policy};

/// How the items of a batch relate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BatchMode {
    /// Each item is decided on its own.
    #[default]
    Independent,
    /// Every item is consumed, or none is: one denial rejects the batch.
    AllOrNothing,
}

/// One request for `cost` units of `key` under the policy `name`.
#[derive(Clone, Copy, Debug)]
pub struct CheckItem<'a> {
    name: &'a str,
    policy: Policy,
    key: &'a str,
    cost: NonZeroU64,
    spend: Spend,
}

/// A check item that breaks a rule; nothing is read or written for it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum InvalidItem {
    /// `cost` is zero.
    #[error("cost must be at least 1")]
    ZeroCost,
    /// `cost` is above 2^53, past what every backend computes exactly.
    #[error("cost must be at most 2^53")]
    CostTooLarge,
    /// `key` is empty.
    #[error("key must not be empty")]
    EmptyKey,
    /// The policy name is empty or holds a NUL byte (the store's key
    /// separator).
    #[error("policy name must be non-empty and must not contain NUL")]
    PolicyName,
}

impl<'a> CheckItem<'a> {
    /// A request for `cost` units of `key`, counted under `policy`. State is
    /// kept per `(name, key)`: one key under two policies has two states.
    ///
    /// # Errors
    ///
    /// [`InvalidItem`] when `cost` is 0 or above 2^53, `key` is empty, or
    /// `name` is empty or contains NUL.
    pub fn new(
        name: &'a str,
        policy: Policy,
        key: &'a str,
        cost: u64,
    ) -> Result<Self, InvalidItem> {
        let cost = NonZeroU64::new(cost).ok_or(InvalidItem::ZeroCost)?;
        if cost.get() > MAX_EXACT {
            return Err(InvalidItem::CostTooLarge);
        }
        if key.is_empty() {
            return Err(InvalidItem::EmptyKey);
        }
        if name.is_empty() || name.contains('\0') {
            return Err(InvalidItem::PolicyName);
        }
        Ok(Self {
            name,
            policy,
            key,
            cost,
            spend: Spend::WhenAdmitted,
        })
    }

    /// The same item, spending as `spend` says when it is denied. In an
    /// all-or-nothing batch a denial commits nothing, whatever the items
    /// say.
    #[must_use]
    pub fn with_spend(mut self, spend: Spend) -> Self {
        self.spend = spend;
        self
    }

    /// What a denial of this item spends ([`Spend::WhenAdmitted`] unless
    /// set).
    pub fn spend(&self) -> Spend {
        self.spend
    }

    /// The policy's name: its state namespace.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The policy applied.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The key counted.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// Units asked for.
    pub fn cost(&self) -> NonZeroU64 {
        self.cost
    }
}
