//! What a check asks for.

use std::num::NonZeroU64;

use thiserror::Error;

use crate::algorithm::Spend;
use crate::policy::{Algorithm, MAX_EXACT, Policy};

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
    /// The id the slot an acquire takes gets; `Some` exactly for a
    /// concurrency policy's items.
    slot: Option<u64>,
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
    /// A check of a concurrency policy, which is acquired (and released),
    /// never checked; or an acquire of a rate.
    #[error("a {0} policy is {verb}", verb = if *.0 == Algorithm::Concurrency { "acquired (Concurrency/Acquire), not checked" } else { "checked, not acquired" })]
    WrongOperation(Algorithm),
    /// An acquire's `cost` is above the concurrency limit: it could never
    /// be held.
    #[error("cost {cost} is above the concurrency limit {limit}")]
    CostAboveLimit {
        /// The cost asked.
        cost: u64,
        /// The policy's limit.
        limit: u64,
    },
}

impl<'a> CheckItem<'a> {
    /// A request for `cost` units of `key`, counted under `policy`. State is
    /// kept per `(name, key)`: one key under two policies has two states.
    ///
    /// # Errors
    ///
    /// [`InvalidItem`] when `cost` is 0 or above 2^53, `key` is empty,
    /// `name` is empty or contains NUL, or the policy is a concurrency
    /// limit ([`CheckItem::acquire`] is its item).
    pub fn new(
        name: &'a str,
        policy: Policy,
        key: &'a str,
        cost: u64,
    ) -> Result<Self, InvalidItem> {
        if !policy.algorithm().is_rate() {
            return Err(InvalidItem::WrongOperation(policy.algorithm()));
        }
        Self::build(name, policy, key, cost, None)
    }

    /// A request to hold `cost` units of the concurrency limit `policy` on
    /// `key`, in a slot that gets the id `slot` (unguessable: whoever
    /// presents it can release it). Checked (and batched) like any item:
    /// admitted, it adds the slot to the key's ledger.
    ///
    /// # Errors
    ///
    /// As [`CheckItem::new`], and [`InvalidItem::WrongOperation`] for a
    /// rate, [`InvalidItem::CostAboveLimit`] for a cost above the limit.
    pub fn acquire(
        name: &'a str,
        policy: Policy,
        key: &'a str,
        cost: u64,
        slot: u64,
    ) -> Result<Self, InvalidItem> {
        if policy.algorithm().is_rate() {
            return Err(InvalidItem::WrongOperation(policy.algorithm()));
        }
        if cost > policy.limit() {
            return Err(InvalidItem::CostAboveLimit {
                cost,
                limit: policy.limit(),
            });
        }
        Self::build(name, policy, key, cost, Some(slot))
    }

    fn build(
        name: &'a str,
        policy: Policy,
        key: &'a str,
        cost: u64,
        slot: Option<u64>,
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
            slot,
        })
    }

    /// The id of the slot this item acquires, for a concurrency policy.
    pub fn slot(&self) -> Option<u64> {
        self.slot
    }

    /// The same item, spending as `spend` says when it is denied. In an
    /// all-or-nothing batch a denial commits nothing, whatever the items
    /// say; a denied acquire never holds anything, whatever it says.
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
